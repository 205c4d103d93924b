package balancer

// window is the redeal's state: the window's steps, each split into DP
// virtual ranks (bins) that stand for the ranks the partitioner will form.
// Bins hold indices into the window's pool, which is sorted costliest first
// (c[i] is member i's step cost, non-increasing in i). Every step keeps a
// loadTree over its bins, so its most and least loaded bins are read in O(1)
// and a change costs O(log DP).
//
// While a journal is open (try), every change is recorded and undo restores
// the window bit for bit: loads and sums are restored, not recomputed, so a
// tried and undone swap leaves no floating-point trace.
type window struct {
	dp, minCount int
	c            []float64 // cost of pool member i
	bins         [][]int32 // bins[k*dp+r]: pool members of step k's virtual rank r
	load         []float64 // load[v] = Σ c over bins[v]
	sum          []float64 // sum[k] = Σ load over step k's bins
	at           []int32   // at[i]: the bin holding pool member i
	trees        []*loadTree
	journal      []change
	recording    bool
}

// change is one journaled edit: a move of the member at position p of bin a
// to the end of bin b (q < 0), or a swap of a[p] and b[q]; with the loads and
// step sums it overwrote.
type change struct {
	a, p, b, q   int
	loadA, loadB float64
	sumA, sumB   float64
}

func newWindow(steps, dp, minCount int, c []float64) *window {
	w := &window{dp: dp, minCount: minCount, c: c, bins: make([][]int32, steps*dp),
		load: make([]float64, steps*dp), sum: make([]float64, steps), at: make([]int32, len(c)),
		trees: make([]*loadTree, steps)}
	for k := range steps {
		w.trees[k] = newLoadTree(w.load[k*dp : (k+1)*dp])
	}
	return w
}

func (w *window) steps() int { return len(w.sum) }

// put appends pool member i to bin v (the deals; not journaled).
func (w *window) put(v int, i int32) {
	w.bins[v] = append(w.bins[v], i)
	w.at[i] = int32(v)
	w.setLoad(v, w.load[v]+w.c[i])
	w.sum[v/w.dp] += w.c[i]
}

// least returns step k's least loaded bin.
func (w *window) least(k int) int { return k*w.dp + w.trees[k].min() }

// extremes returns step k's most and least loaded bins and its mean load.
func (w *window) extremes(k int) (hi, lo int, mean float64) {
	t := w.trees[k]
	return k*w.dp + t.max(), k*w.dp + t.min(), w.sum[k] / float64(w.dp)
}

// imbalance returns step k's virtual max / mean (1 for an empty step).
func (w *window) imbalance(k int) float64 {
	hi, _, mean := w.extremes(k)
	if mean <= 0 {
		return 1
	}
	return w.load[hi] / mean
}

func (w *window) setLoad(v int, x float64) {
	w.load[v] = x
	w.trees[v/w.dp].update(v % w.dp)
}

func (w *window) record(a, p, b, q int) {
	if w.recording {
		w.journal = append(w.journal, change{a, p, b, q, w.load[a], w.load[b], w.sum[a/w.dp], w.sum[b/w.dp]})
	}
}

// move moves the member at position p of bin a to the end of bin b (the last
// member of a takes its place).
func (w *window) move(a, p, b int) {
	w.record(a, p, b, -1)
	x := w.bins[a][p]
	last := len(w.bins[a]) - 1
	w.bins[a][p] = w.bins[a][last]
	w.bins[a] = w.bins[a][:last]
	w.bins[b] = append(w.bins[b], x)
	w.at[x] = int32(b)
	w.shift(a, b, w.c[x])
}

// swap exchanges a[p] and b[q].
func (w *window) swap(a, p, b, q int) {
	w.record(a, p, b, q)
	x, y := w.bins[a][p], w.bins[b][q]
	w.bins[a][p], w.bins[b][q] = y, x
	w.at[x], w.at[y] = int32(b), int32(a)
	w.shift(a, b, w.c[x]-w.c[y])
}

// shift moves cost d from bin a to bin b.
func (w *window) shift(a, b int, d float64) {
	w.setLoad(a, w.load[a]-d)
	w.setLoad(b, w.load[b]+d)
	if ka, kb := a/w.dp, b/w.dp; ka != kb {
		w.sum[ka] -= d
		w.sum[kb] += d
	}
}

// undo reverts the journal, newest change first, and closes it.
func (w *window) undo() {
	for i := len(w.journal) - 1; i >= 0; i-- {
		ch := w.journal[i]
		if ch.q >= 0 {
			x, y := w.bins[ch.a][ch.p], w.bins[ch.b][ch.q]
			w.bins[ch.a][ch.p], w.bins[ch.b][ch.q] = y, x
			w.at[x], w.at[y] = int32(ch.b), int32(ch.a)
		} else {
			last := len(w.bins[ch.b]) - 1
			x := w.bins[ch.b][last]
			w.bins[ch.b] = w.bins[ch.b][:last]
			a := w.bins[ch.a]
			if ch.p == len(a) {
				a = append(a, x)
			} else {
				a = append(a, a[ch.p])
				a[ch.p] = x
			}
			w.bins[ch.a] = a
			w.at[x] = int32(ch.a)
		}
		w.sum[ch.a/w.dp], w.sum[ch.b/w.dp] = ch.sumA, ch.sumB
		w.setLoad(ch.a, ch.loadA)
		w.setLoad(ch.b, ch.loadB)
	}
	w.journal, w.recording = w.journal[:0], false
}
