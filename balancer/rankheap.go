package balancer

// rankHeap is a binary min-heap of ranks (or bins) ordered by (load, index),
// for the balance-first deal and the packed LPT: top is the one a linear scan
// for the least load (ties to the lowest index) would pick.
type rankHeap []rankLoad

type rankLoad struct {
	load float64
	rank int
}

func newRankHeap(dp int) rankHeap {
	h := make(rankHeap, dp)
	for r := range h {
		h[r] = rankLoad{0, r}
	}
	return h
}

func (h rankHeap) less(i, j int) bool {
	if h[i].load != h[j].load {
		return h[i].load < h[j].load
	}
	return h[i].rank < h[j].rank
}

// top returns the least loaded rank.
func (h rankHeap) top() int { return h[0].rank }

// raise adds d ≥ 0 to the top rank's load.
func (h rankHeap) raise(d float64) {
	h[0].load += d
	h.down(0)
}

// setTop gives the top rank the load v ≥ its current load.
func (h rankHeap) setTop(v float64) {
	h[0].load = v
	h.down(0)
}

// set gives rank r the load v ≥ its current load.
func (h rankHeap) set(r int, v float64) {
	for i := range h {
		if h[i].rank == r {
			h[i].load = v
			h.down(i)
			return
		}
	}
}

// update gives rank r the load v, larger or smaller than its current one
// (a rank at the top is found at once).
func (h rankHeap) update(r int, v float64) {
	for i := range h {
		if h[i].rank == r {
			h[i].load = v
			h.up(i)
			h.down(i)
			return
		}
	}
}

func (h rankHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (h rankHeap) down(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(h) && h.less(l, small) {
			small = l
		}
		if r := l + 1; r < len(h) && h.less(r, small) {
			small = r
		}
		if small == i {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}
