package balancer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// solveSubset solves a known system exactly, leaves inactive indices at 0
// and says when the system is singular.
func TestSolveSubset(t *testing.T) {
	g := [][]float64{{4, 2, 9}, {2, 3, 9}, {9, 9, 9}}
	for _, tc := range []struct {
		name   string
		g      [][]float64
		b      []float64
		ridge  []float64
		active []bool
		want   []float64
		ok     bool
	}{
		{"two active", g, []float64{10, 8, 99}, []float64{0, 0, 0}, []bool{true, true, false}, []float64{1.75, 1.5, 0}, true},
		{"ridge on the diagonal", g, []float64{10, 8, 99}, []float64{1, 2, 0}, []bool{true, true, false}, []float64{34.0 / 21, 20.0 / 21, 0}, true},
		{"one active", g, []float64{8, 0, 0}, []float64{0, 0, 0}, []bool{true, false, false}, []float64{2, 0, 0}, true},
		{"singular", [][]float64{{1, 1}, {1, 1}}, []float64{1, 1}, []float64{0, 0}, []bool{true, true}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := solveSubset(tc.g, tc.b, tc.ridge, tc.active)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			for i, w := range tc.want {
				if math.Abs(got[i]-w) > 1e-12 {
					t.Errorf("z = %v, want %v", got, tc.want)
					break
				}
			}
		})
	}
}

// nnls's solve through solveSubset is bit-identical to the Cholesky it had
// (the calibration fits, hence the golden plans, cannot move).
func TestSolveSubsetMatchesPassiveSolve(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		n := 2 + r.IntN(6)
		rows := make([][]float64, 3*n)
		y := make([]float64, len(rows))
		for i := range rows {
			rows[i] = make([]float64, n)
			for j := range rows[i] {
				rows[i][j] = r.NormFloat64() * math.Pow(10, float64(r.IntN(6)))
			}
			y[i] = r.NormFloat64()
		}
		g, h := gram(rows, y)
		passive := make([]bool, n)
		ridge := make([]float64, n)
		for j := range passive {
			passive[j], ridge[j] = r.IntN(3) > 0, 1e-12
		}
		want := refSolvePassive(g, h, passive)
		got, _ := solveSubset(g, h, ridge, passive)
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("trial %d: z = %v, want %v (bit for bit)", trial, got, want)
			}
		}
	}
}

// The work-cost fit through solveSubset matches the Gaussian elimination it
// had, on the systems the model accumulates.
func TestRidgeSolveMatchesGauss(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	truth := WorkCost{0.015, 0.020, 0.010, 0.003}
	var m WorkCostModel
	for i := range 400 {
		x := randomItem(r, 0.3)
		m.Observe(x, x.Dot(truth)*(0.9+0.2*r.Float64()))
		prior := WorkCost{r.Float64(), r.Float64(), r.Float64(), r.Float64()}
		lambda := WorkCost{r.Float64(), r.Float64(), r.Float64(), r.Float64()}
		active := [WorkDims]bool{true, i%2 == 0, true, i%3 != 0}
		got, ok := ridgeSolve(m.xtx, m.xty, prior, lambda, active)
		want, wok := refRidgeSolve(m.xtx, m.xty, prior, lambda, active)
		if ok != wok {
			t.Fatalf("item %d: ok %v, want %v", i, ok, wok)
		}
		for j := range want {
			if d := math.Abs(got[j] - want[j]); d > 1e-9*math.Max(1, math.Abs(want[j])) {
				t.Fatalf("item %d: coefficients %v, want %v", i, got, want)
			}
		}
	}
}

func gram(rows [][]float64, y []float64) ([][]float64, []float64) {
	n := len(rows[0])
	g, h := make([][]float64, n), make([]float64, n)
	for j := range g {
		g[j] = make([]float64, n)
	}
	for i, row := range rows {
		for j, a := range row {
			h[j] += a * y[i]
			for k, b := range row {
				g[j][k] += a * b
			}
		}
	}
	return g, h
}

// refSolvePassive is nnls.go's solve before solveSubset: it solves G_PP z_P = h_P by Cholesky (with a tiny ridge for
// collinear columns); z is 0 off P.
func refSolvePassive(g [][]float64, h []float64, passive []bool) []float64 {
	var idx []int
	for j, p := range passive {
		if p {
			idx = append(idx, j)
		}
	}
	k := len(idx)
	l := make([][]float64, k)
	for a := range l {
		l[a] = make([]float64, k)
	}
	for a := range k {
		for b := 0; b <= a; b++ {
			s := g[idx[a]][idx[b]]
			if a == b {
				s += 1e-12
			}
			for c := range b {
				s -= l[a][c] * l[b][c]
			}
			if a == b {
				l[a][a] = math.Sqrt(math.Max(s, 1e-300))
			} else {
				l[a][b] = s / l[b][b]
			}
		}
	}
	v := make([]float64, k)
	for a := range k {
		s := h[idx[a]]
		for c := range a {
			s -= l[a][c] * v[c]
		}
		v[a] = s / l[a][a]
	}
	for a := k - 1; a >= 0; a-- {
		s := v[a]
		for c := a + 1; c < k; c++ {
			s -= l[c][a] * v[c]
		}
		v[a] = s / l[a][a]
	}
	z := make([]float64, len(h))
	for a, j := range idx {
		z[j] = v[a]
	}
	return z
}

// refRidgeSolve is workcost.go's solve before solveSubset: it solves the ridge system over the active dimensions (the
// others' coefficients are 0) by Gaussian elimination with partial
// pivoting; ok is false for a singular system.
func refRidgeSolve(xtx [WorkDims][WorkDims]float64, xty, prior, lambda WorkCost, active [WorkDims]bool) (WorkCost, bool) {
	var idx []int
	for i, a := range active {
		if a {
			idx = append(idx, i)
		}
	}
	k := len(idx)
	a := make([][]float64, k)
	for r, i := range idx {
		a[r] = make([]float64, k+1)
		for c, j := range idx {
			a[r][c] = xtx[i][j]
		}
		a[r][r] += lambda[i]
		a[r][k] = xty[i] + lambda[i]*prior[i]
	}
	for col := range k {
		piv := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if math.Abs(a[piv][col]) < 1e-300 {
			return WorkCost{}, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := range k {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= k; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	var out WorkCost
	for r, i := range idx {
		out[i] = a[r][k] / a[r][r]
	}
	return out, true
}
