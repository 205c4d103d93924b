package pipeline

import (
	"math"
	"slices"
)

// formatColumn holds one image format per item: an index into a table of
// the distinct formats, one byte an item, or the strings themselves once
// more than 256 distinct formats came (from a feature cache or a worker,
// outside input). The zero value is empty; append adds one.
type formatColumn struct {
	idx   []uint8
	names []string
	index map[string]uint8 // names' positions, while building
	all   []string         // every format, after the table overflowed (idx nil)
}

func newFormatColumn(n int) formatColumn { return formatColumn{idx: make([]uint8, 0, n)} }

// append adds format s.
func (c *formatColumn) append(s string) {
	if c.all != nil {
		c.all = append(c.all, s)
		return
	}
	if c.index == nil { // a new column, or appends after done
		c.index = make(map[string]uint8, len(c.names))
		for i, n := range c.names {
			c.index[n] = uint8(i)
		}
	}
	k, ok := c.index[s]
	if !ok {
		if len(c.names) > math.MaxUint8 {
			c.all = make([]string, 0, cap(c.idx))
			for _, i := range c.idx {
				c.all = append(c.all, c.names[i])
			}
			c.all = append(c.all, s)
			c.idx, c.names, c.index = nil, nil, nil
			return
		}
		k = uint8(len(c.names))
		c.index[s] = k
		c.names = append(c.names, s)
	}
	c.idx = append(c.idx, k)
}

// clone returns a copy that appends do not share with c.
func (c *formatColumn) clone() formatColumn {
	return formatColumn{idx: slices.Clone(c.idx), names: slices.Clone(c.names), all: slices.Clone(c.all)}
}

// done drops the building map (so two equal columns compare equal).
func (c *formatColumn) done() { c.index = nil }

func (c *formatColumn) len() int {
	if c.all != nil {
		return len(c.all)
	}
	return len(c.idx)
}

// at returns format i.
func (c *formatColumn) at(i int) string {
	if c.all != nil {
		return c.all[i]
	}
	return c.names[c.idx[i]]
}

// bytes is what the column holds, the table's strings not counted.
func (c *formatColumn) bytes() int64 {
	return int64(cap(c.idx)) + int64(cap(c.names)+cap(c.all))*16
}
