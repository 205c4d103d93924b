package balancer

import (
	"cmp"
	"math"
	"slices"
)

// Under modality placement a rank-step takes max(Σ vision, Σ text) + Σ fusion
// + overhead. Per observation one tower is the larger ("active"), so the step
// is linear in the features within each regime, with coefficient a_f = V_f +
// F_f on the rows where vision is active and b_f = T_f + F_f where text is:
// the step time is the larger of two non-negative linear models, max(a·x,
// b·x), and only a and b are identifiable. fitModality fits them by
// alternating between assigning each observation to the tower its current
// fit makes larger and refitting (the k-plane regression of two planes), and
// reports the canonical split F_f = min(a_f, b_f), V_f = a_f − F_f, T_f =
// b_f − F_f: the part both regimes pay is fusion. When the truth has no
// vision term in a text feature and no text term in an image feature (the
// dual-encoder architecture), the split is the truth's.
//
// The free fit determines a tower's coefficients only from the observations
// where that tower is the larger, and alternation stops in local optima. So a
// restricted fit comes first (restrictedColumns: a fusion column per feature,
// shared by both regimes, plus the owning tower's), which is determined even
// when one regime has few or no observations; it alternates from several
// starts (startAssignments) and the best one's assignment starts the free
// fit. A regime the free fit sees on fewer than minRegimeRows observations
// per coefficient takes its coefficients from the restricted fit. Of the two
// fits, the one with the smaller squared error is kept.

// minRegimeRows is how many observations per fitted coefficient each regime
// needs before the free fit is trusted over the restricted one.
const minRegimeRows = 2

// startQuantiles is how many steps the scan of starting thresholds takes
// (startAssignments).
const startQuantiles = 8

// maxAlternations bounds the assign-and-refit rounds.
const maxAlternations = 20

type column struct {
	c Component
	f Feature
}

// gpuFeature reports whether the GPU cost has a term for f: every feature
// but FeatComplexity. Image complexity changes what decoding costs the
// loader's CPUs (the scale-out work's decode cost), not what the GPU
// computes on a fixed number of image tokens; a coefficient for it could
// only absorb noise (docs/cost-model.md, "Image complexity").
func gpuFeature(f Feature) bool { return f != FeatComplexity }

// gpuFeatures lists the features with a GPU cost term.
func gpuFeatures() []Feature {
	var out []Feature
	for f := range NumFeatures {
		if gpuFeature(f) {
			out = append(out, f)
		}
	}
	return out
}

// restrictedColumns are, per GPU feature, a fusion column (shared by both
// regimes) and a column for each tower that owns the feature or that the
// prior prices it in; when both towers have one, they already span what a
// fusion column would add, and it is left out (it would be collinear).
func restrictedColumns(prior CostModel) []column {
	var cols []column
	for _, f := range gpuFeatures() {
		var towers []column
		for _, c := range []Component{Vision, Text} {
			if prior.Coef[c][f] > 0 || ownerOf[f] == c {
				towers = append(towers, column{c, f})
			}
		}
		cols = append(cols, towers...)
		if len(towers) < 2 {
			cols = append(cols, column{Fusion, f})
		}
	}
	return cols
}

// towerColumns are a vision and a text coefficient for every GPU feature:
// a and b of the file comment.
func towerColumns() []column {
	var cols []column
	for _, c := range []Component{Vision, Text} {
		for _, f := range gpuFeatures() {
			cols = append(cols, column{c, f})
		}
	}
	return cols
}

// modalityFit is one alternating fit's result.
type modalityFit struct {
	model        CostModel
	overhead     float64
	sse          float64
	visionActive []bool
}

// fitModality returns the modality fit's model and overhead (file comment).
func fitModality(prior CostModel, obs []Observation, overhead bool) (CostModel, float64) {
	restricted, free := restrictedColumns(prior), towerColumns()
	best := modalityFit{sse: math.Inf(1)}
	for _, start := range startAssignments(prior, obs) {
		if r := alternate(restricted, obs, start, overhead); r.sse < best.sse {
			best = r
		}
	}
	bestFree := alternate(free, obs, best.visionActive, overhead)
	if thin := thinRegimes(bestFree.visionActive, len(gpuFeatures())); len(thin) < 2 {
		for _, c := range thin {
			bestFree.model.Coef[c] = best.model.Coef[c].Add(best.model.Coef[Fusion])
		}
		if len(thin) > 0 {
			bestFree.sse = sse(bestFree.model, bestFree.overhead, obs)
		}
		if bestFree.sse < best.sse {
			best = bestFree
			best.model = splitFusion(best.model)
		}
	}
	return best.model, best.overhead
}

// startAssignments are the alternations' starting points: the prior's own
// choice of the larger tower, and startQuantiles thresholds on the prior's
// text share T / (V + T) (the top fraction q text-active). A prior wrong by
// a constant factor per tower still orders the observations by text share
// correctly; it only misplaces the threshold, which the scan recovers.
func startAssignments(prior CostModel, obs []Observation) [][]bool {
	own := make([]bool, len(obs))
	share := make([]float64, len(obs))
	for i, o := range obs {
		c := prior.CostOf(o.Features)
		own[i] = c.Vision >= c.Text
		if c.Vision+c.Text > 0 {
			share[i] = c.Text / (c.Vision + c.Text)
		}
	}
	order := make([]int, len(obs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(share[b], share[a]) })
	starts := [][]bool{own}
	for k := range startQuantiles + 1 {
		s := make([]bool, len(obs))
		textN := k * len(obs) / startQuantiles
		for j, i := range order {
			s[i] = j >= textN
		}
		starts = append(starts, s)
	}
	return starts
}

// thinRegimes returns the towers that are the larger on fewer than
// minRegimeRows observations per coefficient: the free fit cannot determine
// their coefficients, and fitModality takes them from the restricted fit
// (tower plus fusion, as a and b are).
func thinRegimes(visionActive []bool, perRegime int) []Component {
	var nv int
	for _, v := range visionActive {
		if v {
			nv++
		}
	}
	var thin []Component
	if nv < minRegimeRows*perRegime {
		thin = append(thin, Vision)
	}
	if len(visionActive)-nv < minRegimeRows*perRegime {
		thin = append(thin, Text)
	}
	return thin
}

// sse is the squared error of a modality model on obs.
func sse(m CostModel, overhead float64, obs []Observation) float64 {
	var s float64
	for _, o := range obs {
		r := Modality.StepCost(m.CostOf(o.Features)) + overhead - o.Seconds
		s += r * r
	}
	return s
}

// splitFusion turns tower coefficients a (Vision) and b (Text) into the
// canonical split of the file comment; fusion coefficients already in m are
// kept and added to.
func splitFusion(m CostModel) CostModel {
	for f := range NumFeatures {
		common := min(m.Coef[Vision][f], m.Coef[Text][f])
		m.Coef[Vision][f] -= common
		m.Coef[Text][f] -= common
		m.Coef[Fusion][f] += common
	}
	return m
}

// alternate fits cols to obs, starting from the assignment start: it refits
// with each observation's active tower fixed, reassigns every observation to
// the tower the fit makes larger, and stops when no assignment changes. It
// returns the iterate with the smallest squared error (the rounds need not
// improve monotonically).
func alternate(cols []column, obs []Observation, start []bool, overhead bool) modalityFit {
	active := append([]bool(nil), start...)
	best := modalityFit{sse: math.Inf(1)}
	for range maxAlternations {
		m, oh := fitAssigned(cols, obs, active, overhead)
		sse, changed := 0.0, false
		next := make([]bool, len(obs))
		for i, o := range obs {
			c := m.CostOf(o.Features)
			r := Modality.StepCost(c) + oh - o.Seconds
			sse += r * r
			next[i] = c.Vision >= c.Text
			changed = changed || next[i] != active[i]
		}
		if sse < best.sse {
			best = modalityFit{model: m, overhead: oh, sse: sse, visionActive: active}
		}
		if !changed {
			break
		}
		active = next
	}
	return best
}

// fitAssigned is the non-negative least-squares fit of cols with each
// observation's active tower fixed: a vision column counts on the rows where
// vision is active, a text column where text is, a fusion column on all. It
// builds the normal equations from the two regimes' feature moments, so a
// fit costs one pass over the observations with 7×7 products.
func fitAssigned(cols []column, obs []Observation, visionActive []bool, overhead bool) (CostModel, float64) {
	const d = int(NumFeatures) + 1 // the features and the overhead's 1
	var sv, st [d][d]float64       // Σ x̃x̃ᵀ over the vision-active and the text-active rows
	var hv, ht [d]float64          // Σ x̃·seconds
	var x [d]float64
	for i, o := range obs {
		copy(x[:], o.Features[:])
		x[FeatComplexity] = 0 // no GPU term (gpuFeature)
		x[NumFeatures] = 0
		if overhead {
			x[NumFeatures] = 1
		}
		s, h := &st, &ht
		if visionActive[i] {
			s, h = &sv, &hv
		}
		for j, a := range x {
			if a == 0 {
				continue
			}
			h[j] += a * o.Seconds
			for k, b := range x {
				s[j][k] += a * b
			}
		}
	}
	all := append(cols, column{Fusion, NumFeatures}) // the overhead counts on every row
	n := len(all)
	g := make([][]float64, n)
	h := make([]float64, n)
	for j, cj := range all {
		g[j] = make([]float64, n)
		if cj.c != Text {
			h[j] += hv[cj.f]
		}
		if cj.c != Vision {
			h[j] += ht[cj.f]
		}
		for k, ck := range all {
			if cj.c != Text && ck.c != Text {
				g[j][k] += sv[cj.f][ck.f]
			}
			if cj.c != Vision && ck.c != Vision {
				g[j][k] += st[cj.f][ck.f]
			}
		}
	}
	theta := nnlsGram(g, h)
	var m CostModel
	for k, col := range cols {
		m.Coef[col.c][col.f] = theta[k]
	}
	return m, theta[len(cols)]
}
