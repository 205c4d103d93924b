package pipeline

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"image"
	"image/color"
	"image/png"
	"io"
	"strings"

	"github.com/disintegration/imaging"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Contact sheet geometry: two tiles per row, each the picture in a square box
// and its labels beside it.
const (
	sheetBox     = 224
	sheetText    = 360
	sheetGap     = 10
	sheetCols    = 2
	sheetLineH   = 15
	sheetMaxLine = sheetText / 7 // basicfont glyphs are 7 px wide
)

var (
	sheetInk     = color.NRGBA{0x22, 0x22, 0x22, 0xff}
	sheetMuted   = color.NRGBA{0x55, 0x55, 0x55, 0xff}
	sheetPadding = color.NRGBA{0xd5, 0x5e, 0x00, 0xff} // Okabe–Ito vermilion
	sheetFrame   = color.NRGBA{0xdd, 0xdd, 0xdd, 0xff}
)

// ContactSheet tiles samples (one rank's step) with imaging: each picture is
// shown in a sheetBox square (small tensors enlarged with nearest-neighbour,
// so every pixel the trainer gets stays visible), with its id, micro-batch,
// text and image tokens, cost and decoded caption beside it. title heads the
// sheet.
func ContactSheet(samples []SheetSample, title string) *image.NRGBA {
	rows := (len(samples) + sheetCols - 1) / sheetCols
	tileW, tileH := sheetBox+sheetGap+sheetText, sheetBox+sheetGap
	head := 2*sheetLineH + sheetGap
	sheet := imaging.New(sheetGap+sheetCols*(tileW+sheetGap), head+rows*tileH+sheetGap, color.White)
	drawText(sheet, sheetGap, sheetLineH, title, sheetInk)
	drawText(sheet, sheetGap, 2*sheetLineH, "pictures de-normalized from the tensors sent; captions decoded from the ids sent", sheetMuted)
	for i, s := range samples {
		x := sheetGap + (i%sheetCols)*(tileW+sheetGap)
		y := head + (i/sheetCols)*tileH
		frame := imaging.New(sheetBox+2, sheetBox+2, sheetFrame)
		sheet = imaging.Paste(sheet, frame, image.Pt(x-1, y-1))
		if s.Image != nil {
			pic := fitBox(s.Image, sheetBox)
			b := pic.Bounds()
			sheet = imaging.Paste(sheet, pic, image.Pt(x+(sheetBox-b.Dx())/2, y+(sheetBox-b.Dy())/2))
		}
		tx, ty := x+sheetBox+sheetGap, y+sheetLineH-3
		col := sheetInk
		if s.Weight == 0 {
			col = sheetPadding
		}
		for _, line := range sampleLabel(s) {
			if ty > y+sheetBox {
				break
			}
			drawText(sheet, tx, ty, line, col)
			ty += sheetLineH
			col = sheetInk
		}
	}
	return sheet
}

// sampleLabel is the text beside a picture: facts first, then the caption
// wrapped to the text column.
func sampleLabel(s SheetSample) []string {
	first := s.ID
	if s.Weight == 0 {
		first += "  (padding, weight 0)"
	}
	lines := []string{
		first,
		fmt.Sprintf("micro-batch %d  text %d  image %d tokens", s.MicroBatch, s.TextTokens, s.ImageTokens),
		fmt.Sprintf("cost %.6g", s.Cost),
	}
	if s.Image != nil {
		b := s.Image.Bounds()
		lines = append(lines, fmt.Sprintf("tensor %d x %d px", b.Dx(), b.Dy()))
	}
	lines = append(lines, "")
	return append(lines, wrap(s.Caption, sheetMaxLine)...)
}

// fitBox scales img into a box×box square: down with Lanczos, up by a whole
// factor with nearest-neighbour.
func fitBox(img image.Image, box int) *image.NRGBA {
	b := img.Bounds()
	if b.Dx() > box || b.Dy() > box {
		return imaging.Fit(img, box, box, imaging.Lanczos)
	}
	k := max(1, min(box/b.Dx(), box/b.Dy()))
	return imaging.Resize(img, b.Dx()*k, b.Dy()*k, imaging.NearestNeighbor)
}

// wrap splits text into lines of at most n runes at spaces (long words are cut).
func wrap(text string, n int) []string {
	var lines []string
	var cur []rune
	for _, w := range strings.Fields(text) {
		rw := []rune(w)
		for len(rw) > n {
			if len(cur) > 0 {
				lines, cur = append(lines, string(cur)), nil
			}
			lines, rw = append(lines, string(rw[:n])), rw[n:]
		}
		if len(cur) > 0 && len(cur)+1+len(rw) > n {
			lines, cur = append(lines, string(cur)), nil
		}
		if len(cur) > 0 {
			cur = append(cur, ' ')
		}
		cur = append(cur, rw...)
	}
	if len(cur) > 0 {
		lines = append(lines, string(cur))
	}
	return lines
}

// drawText writes one line with its baseline at y. Characters basicfont lacks
// are drawn as its replacement box.
func drawText(dst *image.NRGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: dst, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// WriteContactSheetPNG encodes ContactSheet(samples, title) as PNG.
func WriteContactSheetPNG(w io.Writer, samples []SheetSample, title string) error {
	return png.Encode(w, ContactSheet(samples, title))
}

// WriteContactSheetHTML writes the same sheet as a self-contained page:
// each picture a PNG data URL at its tensor size (scaled up by the browser,
// pixelated), with its facts and caption.
func WriteContactSheetHTML(w io.Writer, samples []SheetSample, title string) error {
	type item struct {
		SheetSample
		Src    template.URL
		W, H   int
		Facts  []string
		HasImg bool
	}
	var items []item
	for _, s := range samples {
		it := item{SheetSample: s, Facts: sampleLabel(s)[1:3]}
		if s.Image != nil {
			var buf bytes.Buffer
			if err := png.Encode(&buf, s.Image); err != nil {
				return err
			}
			b := s.Image.Bounds()
			k := max(1, min(sheetBox/b.Dx(), sheetBox/b.Dy()))
			it.Src, it.W, it.H, it.HasImg = template.URL("data:image/png;base64,"+base64.StdEncoding.EncodeToString(buf.Bytes())), b.Dx()*k, b.Dy()*k, true
		}
		items = append(items, it)
	}
	return sheetTmpl.Execute(w, struct {
		Title string
		Items []item
	}{title, items})
}

var sheetTmpl = template.Must(template.New("sheet").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>body{font-family:system-ui,sans-serif;margin:1.2em auto;max-width:1280px;padding:0 1em;color:#222}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
figure{display:flex;gap:12px;margin:0;border:1px solid #ddd;padding:6px}
.box{width:224px;height:224px;display:flex;align-items:center;justify-content:center;background:#f4f4f4;flex:none}
img{image-rendering:pixelated;max-width:224px;max-height:224px}.pad{color:#D55E00}.facts{color:#444;font-size:.9em}</style></head><body>
<h1>{{.Title}}</h1><p class="facts">Pictures de-normalized from the tensors sent; captions decoded from the ids sent.</p>
<div class="grid">{{range .Items}}<figure><div class="box">{{if .HasImg}}<img src="{{.Src}}" width="{{.W}}" height="{{.H}}" alt="{{.ID}}">{{end}}</div>
<figcaption><b data-id="{{.ID}}">{{.ID}}</b>{{if eq .Weight 0.0}} <span class="pad">(padding, weight 0)</span>{{end}}<div class="facts">{{range .Facts}}{{.}}<br>{{end}}</div><p>{{.Caption}}</p></figcaption></figure>
{{end}}</div></body></html>
`))
