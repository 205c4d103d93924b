package balancer

// loadTree keeps the most and the least loaded of n slots (a step's virtual
// ranks) under point updates: a tournament tree over load, O(1) to read,
// O(log n) to update. Ties go to the lowest index, as a linear scan with a
// strict comparison would pick.
type loadTree struct {
	load   []float64 // the slots' loads (shared with the caller)
	size   int       // leaves: the power of two ≥ n
	hi, lo []int32   // hi[i], lo[i]: winning slot of node i (-1: no slot)
}

func newLoadTree(load []float64) *loadTree {
	size := 1
	for size < len(load) {
		size *= 2
	}
	t := &loadTree{load: load, size: size, hi: make([]int32, 2*size), lo: make([]int32, 2*size)}
	for i := range size {
		v := int32(-1)
		if i < len(load) {
			v = int32(i)
		}
		t.hi[size+i], t.lo[size+i] = v, v
	}
	for i := size - 1; i >= 1; i-- {
		t.pull(i)
	}
	return t
}

func (t *loadTree) pull(i int) {
	t.hi[i] = t.pick(t.hi[2*i], t.hi[2*i+1], true)
	t.lo[i] = t.pick(t.lo[2*i], t.lo[2*i+1], false)
}

// pick returns the winner of a and b (a has the lower indices).
func (t *loadTree) pick(a, b int32, most bool) int32 {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	case most && t.load[b] > t.load[a], !most && t.load[b] < t.load[a]:
		return b
	}
	return a
}

// update restores the tree after slot i's load changed.
func (t *loadTree) update(i int) {
	for n := (t.size + i) / 2; n >= 1; n /= 2 {
		t.pull(n)
	}
}

// max and min return the most and the least loaded slot.
func (t *loadTree) max() int { return int(t.hi[1]) }
func (t *loadTree) min() int { return int(t.lo[1]) }
