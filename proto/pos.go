package proto

// Pos is a position in a job's plan: a step of an epoch. A rank's cursor,
// the step it needs next and the steps a register reply or a resend names
// are Pos values; positions order by epoch, then step. (e, steps of e) and
// (e+1, 0) name the same place; serve's epoch book (epochs.Book.Norm) makes
// them equal.
type Pos struct{ Epoch, Step int }

// Less reports whether p comes before q.
func (p Pos) Less(q Pos) bool {
	if p.Epoch != q.Epoch {
		return p.Epoch < q.Epoch
	}
	return p.Step < q.Step
}
