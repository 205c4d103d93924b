package synth

import (
	"math"
	"strings"
)

// words is ordered by assumed frequency: pickWord draws low ranks more often.
var words = strings.Fields(`
a the of and in on with at by for an to from near under over is are two three
photo image picture view close-up red blue green yellow white black small large
old new bright dark cat dog man woman child bird car tree house street city sky
water river mountain field flower table window door road beach boat train plane
horse cow sheep book cup bowl plate chair bed sofa lamp wall floor grass snow
rain sun cloud night morning evening light shadow people group crowd standing
sitting walking running holding looking wearing playing eating reading smiling
wooden metal glass stone plastic round square tall short long wide narrow empty
full busy quiet colorful vintage modern rustic urban rural sunny cloudy foggy
painting drawing sketch illustration portrait landscape macro aerial panoramic
detailed blurry sharp soft vivid muted pastel neon golden silver rusty shiny
kitchen garden park market bridge tower castle church temple museum library
station harbor island forest desert valley canyon lake ocean wave sand rock
bicycle motorcycle truck bus tram ship kite balloon umbrella hat coat dress shirt
shoes bag clock phone laptop camera guitar piano violin drum ball racket
apple banana orange bread cake pizza coffee tea wine cheese salad soup
background foreground center corner edge surface texture pattern reflection
`)

// multiScript words appear with a small probability in strong-skew captions.
var multiScript = strings.Fields(`
東京 猫 桜 山 海 Ελλάδα θάλασσα ουρανός Москва кошка зима река القاهرة
قطة بحر שלום ים 서울 고양이 바다 ภูเขา แมว मुंबई बिल्ली नदी café naïve
Zürich façade piñata smörgåsbord 🐈 🌊 ☀️ 🚲
`)

// captionWords draws the caption word count.
func captionWords(r *rng, c Config) int {
	if c.Skew == SkewNone {
		return c.FixedWords
	}
	if r.float() < 0.03 { // a few paragraphs
		return 100 + r.intn(300)
	}
	return clampInt(int(math.Round(r.lognorm(9, 0.8))), 1, 400)
}

// pickWord draws a Zipf-like (log-uniform rank) word.
func pickWord(r *rng, c Config) string {
	if c.Skew == SkewStrong && r.float() < 0.04 {
		return multiScript[r.intn(len(multiScript))]
	}
	rank := int(math.Exp(r.float()*math.Log(float64(len(words))+1))) - 1
	return words[clampInt(rank, 0, len(words)-1)]
}

// caption builds a caption of n words in sentences of 6..20 words.
func caption(r *rng, c Config, n int) string {
	var b strings.Builder
	sentence := 0
	for i := range n {
		w := pickWord(r, c)
		if sentence == 0 {
			if i > 0 {
				b.WriteByte(' ')
			}
			if w[0] >= 'a' && w[0] <= 'z' {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			sentence = 6 + r.intn(15)
		} else {
			b.WriteByte(' ')
		}
		b.WriteString(w)
		sentence--
		if sentence == 0 || i == n-1 {
			b.WriteByte('.')
			sentence = 0
		}
	}
	return b.String()
}
