package serve

import "github.com/mmfeed/mmfeed/proto"

// The rank table's verbs for package control (control.Ranks). They name
// what deliver.Ranks provides; this file goes when the rank table moves
// there.

// Cursor is the next step published to rank r.
func (t *rankTable) Cursor(r int) proto.Pos { return t.get(r).cursor }

// Next is the first step rank r's trainer still needs.
func (t *rankTable) Next(r int) proto.Pos { return t.get(r).next }

// Gen is the replay generation of rank r's publishes.
func (t *rankTable) Gen(r int) int { return t.get(r).gen }

// SwapConn records the connection of rank r's register and reports whether
// it is the one of its previous register.
func (t *rankTable) SwapConn(r int, conn string) (same bool) { return t.swapConn(r, conn) }

// SetNext records the first step rank r's trainer still needs (with force
// it may move backwards) and reports whether it set it.
func (t *rankTable) SetNext(r int, next proto.Pos, force bool) bool {
	return t.setNext(r, next, force)
}
