package loader

import "unsafe"

// arenaChunk is the size of one stringArena block.
const arenaChunk = 64 << 10

// arenaMax is the longest string a stringArena copies; a longer one keeps
// its own allocation.
const arenaMax = 1 << 10

// stringArena packs the short strings an index keeps for each entry (id,
// location, caption, image path) end to end in 64 KiB blocks, instead of one
// allocation each rounded up to its size class. A block lives while any of
// its strings does, so it serves strings that live together: an index's
// entries. Bytes written are never changed. Not safe for concurrent use.
type stringArena struct{ buf []byte }

// add returns a copy of s in the arena (s itself when empty or long).
func (a *stringArena) add(s string) string {
	if len(s) == 0 || len(s) > arenaMax {
		return s
	}
	if cap(a.buf)-len(a.buf) < len(s) {
		a.buf = make([]byte, 0, arenaChunk)
	}
	at := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[at], len(s))
}

// entry returns e with its strings copied into the arena.
func (a *stringArena) entry(e Entry) Entry {
	e.ID, e.Location, e.Text, e.ImageName = a.add(e.ID), a.add(e.Location), a.add(e.Text), a.add(e.ImageName)
	e.ref.root, e.ref.path = a.add(e.ref.root), a.add(e.ref.path)
	return e
}
