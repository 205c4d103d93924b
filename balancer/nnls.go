package balancer

import "math"

// nnlsScaled solves min ‖A x − y‖ subject to x ≥ 0 for the rows of A, after
// scaling every column to unit norm (the features span many orders of
// magnitude); all-zero columns get 0.
func nnlsScaled(rows [][]float64, y []float64) []float64 {
	n := len(rows[0])
	g := make([][]float64, n) // Gram matrix AᵀA
	h := make([]float64, n)   // Aᵀy
	for j := range g {
		g[j] = make([]float64, n)
	}
	for i, r := range rows {
		for j, a := range r {
			if a == 0 {
				continue
			}
			h[j] += a * y[i]
			for k, b := range r {
				g[j][k] += a * b
			}
		}
	}
	return nnlsGram(g, h)
}

// nnlsGram is nnlsScaled given the Gram matrix G = AᵀA and h = Aᵀy (both are
// modified): it scales the columns to unit norm, solves, and scales back.
func nnlsGram(g [][]float64, h []float64) []float64 {
	n := len(h)
	norm := make([]float64, n)
	for j := range norm {
		norm[j] = math.Sqrt(math.Max(g[j][j], 0))
	}
	for j := range n {
		if norm[j] == 0 {
			h[j] = 0
			for k := range n {
				g[j][k], g[k][j] = 0, 0
			}
		}
	}
	for j := range n {
		if norm[j] == 0 {
			continue
		}
		h[j] /= norm[j]
		for k := range n {
			if norm[k] != 0 {
				g[j][k] /= norm[j] * norm[k]
			}
		}
	}
	x := nnls(g, h)
	for j := range x {
		if norm[j] > 0 {
			x[j] /= norm[j]
		} else {
			x[j] = 0
		}
	}
	return x
}

// nnls is Lawson–Hanson on the normal equations: minimise ½xᵀGx − hᵀx with
// x ≥ 0, where G = AᵀA and h = Aᵀy.
func nnls(g [][]float64, h []float64) []float64 {
	n := len(h)
	x := make([]float64, n)
	passive := make([]bool, n)
	w := make([]float64, n)
	const tol = 1e-12
	ridge := make([]float64, n) // a tiny ridge for collinear columns
	for j := range ridge {
		ridge[j] = 1e-12
	}
	gradient := func() {
		for j := range n {
			w[j] = h[j]
			for k := range n {
				w[j] -= g[j][k] * x[k]
			}
		}
	}
	for outer := 0; outer < 3*n+3; outer++ {
		gradient()
		t, best := -1, tol
		for j := range n {
			if !passive[j] && w[j] > best {
				t, best = j, w[j]
			}
		}
		if t < 0 {
			break
		}
		passive[t] = true
		for inner := 0; inner < 3*n+3; inner++ {
			z, _ := solveSubset(g, h, ridge, passive)
			if z[t] <= 0 && inner == 0 {
				passive[t] = false // numerically useless column
				break
			}
			alpha, feasible := 1.0, true
			for j := range n {
				if passive[j] && z[j] <= 0 {
					feasible = false
					if a := x[j] / (x[j] - z[j]); a < alpha {
						alpha = a
					}
				}
			}
			if feasible {
				copy(x, z)
				break
			}
			for j := range n {
				x[j] += alpha * (z[j] - x[j])
				if passive[j] && x[j] <= tol {
					passive[j], x[j] = false, 0
				}
			}
		}
	}
	return x
}

// solveSubset is the package's one least-squares solve, shared by nnls
// and WorkCostModel: it solves (G_SS + diag(ridge_S)) z_S = b_S for the
// indices S where active is true, by Cholesky (G symmetric, G_SS + ridge
// positive definite); z is 0 off S. ok is false when a pivot was not
// positive (the system is singular or not positive definite): z is then
// finite but not a solution.
func solveSubset(g [][]float64, b, ridge []float64, active []bool) (z []float64, ok bool) {
	var idx []int
	for j, p := range active {
		if p {
			idx = append(idx, j)
		}
	}
	k := len(idx)
	l := make([][]float64, k)
	for a := range l {
		l[a] = make([]float64, k)
	}
	ok = true
	for a := range k {
		for c := 0; c <= a; c++ {
			s := g[idx[a]][idx[c]]
			if a == c {
				s += ridge[idx[a]]
			}
			for d := range c {
				s -= l[a][d] * l[c][d]
			}
			if a == c {
				ok = ok && s > 1e-300
				l[a][a] = math.Sqrt(math.Max(s, 1e-300))
			} else {
				l[a][c] = s / l[c][c]
			}
		}
	}
	v := make([]float64, k)
	for a := range k {
		s := b[idx[a]]
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
	z = make([]float64, len(b))
	for a, j := range idx {
		z[j] = v[a]
	}
	return z, ok
}
