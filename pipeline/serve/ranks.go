package serve

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/deliver"
	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// pos is a position in the job: (epoch, step), proto.Pos. (e, steps of e)
// and (e+1, 0) name the same place; epochs.Book.Norm makes them equal.
type pos = proto.Pos

// rankState is what the service knows of one (dp, mp) rank.
type rankState struct {
	cursor pos    // the next step to publish to the rank
	next   pos    // the first step the rank's trainer still needs
	gen    int    // the replay generation of the rank's publishes
	known  bool   // the trainer registered or reported since the service started
	conn   string // the reply inbox prefix of the rank's last register
	// handed is the last batch (epoch, step, micro-batch) a fetch of the
	// rank was answered with on the core data plane, when anyHanded: no ack
	// moves the rank past it. After a restart it is the whole step recorded
	// in the KV bucket (kvHanded, written before the step's first batch is
	// sent), so acks of what an earlier service sent count.
	handed    proto.BatchKey
	anyHanded bool
	recorded  pos  // the step kvHanded holds for the rank, when recOK
	recOK     bool // kvHanded holds recorded
}

// kvStep is a step of the job as the KV bucket records it: in kvHanded
// (every batch of the rank up to this step may have been sent to it), in
// rank.<dp>.<mp>.handed, and in kvPositions (the rank's last completed step).
type kvStep struct {
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
}

// kvRankHanded returns the key of the last step rank (dp, mp) was handed a
// batch of (core data plane), as services before kvHanded wrote it: read
// when the job's bucket has no kvHanded record of its layout.
func kvRankHanded(dp, mp int) string {
	return "rank." + strconv.Itoa(dp) + "." + strconv.Itoa(mp) + ".handed"
}

// rankTable owns every rank's positions and their persistence in the job's
// KV bucket (kvPositions: every rank's last completed step; kvHanded: the
// last step handed; rank.<dp>.<mp>.gen: the generation).
//
// Invariants, under mu:
//   - a cursor moves forward only when the publisher handed over a step's
//     last micro-batch of the rank's current generation (stepPublished),
//     or to wherever a rewind or a resize puts it;
//   - moved is closed (and replaced) whenever the least cursor moves
//     forward (what waitTurn waits for: a wake-up per cursor move woke all
//     N publishers N times a step), and when a resize resets the cursors;
//   - next moves backwards only on a register (setNext with force);
//   - a generation is written to the KV bucket before the table holds it,
//     so nothing is published with a generation a restart could reuse.
//
// Positions are normalised with the epochs' step counts: mu is taken before
// the epoch book's (epochs.Book), never after.
type rankTable struct {
	mu        sync.Mutex
	handMu    []sync.Mutex // per rank: serialises its handed records
	handed    *handedLog   // every rank's handed step in one KV key (kvHanded)
	positions *positionLog // every rank's last completed step in one KV key (kvPositions)
	// what the bucket held when the service started (under mu)
	storedHand, storedPos storedSteps
	ranks                 []rankState
	moved                 chan struct{}
	mp                    int
	epochs                *epochs.Book
	kv                    *state // the Service's, set up before the table is used
	// advanced, when set (before the control handlers run), is told each
	// forward move of a rank's next needed step (the autoscaling rates).
	advanced func(r int, from, to pos)
}

func newRankTable(n, mp int, epochs *epochs.Book, kv *state) *rankTable {
	return &rankTable{ranks: make([]rankState, n), handMu: make([]sync.Mutex, n), handed: newHandedLog(n),
		positions: newPositionLog(n), moved: make(chan struct{}), mp: mp, epochs: epochs, kv: kv}
}

// load reads rank r's generation and next needed step from the KV bucket;
// both positions are at first when the rank has none recorded.
func (t *rankTable) load(ctx context.Context, r int, first pos) (rankState, error) {
	dp, mp := r/t.mp, r%t.mp
	rs := rankState{cursor: first, next: first}
	gen, _, err := t.kv.getInt(ctx, kvRankGen(dp, mp))
	if err != nil {
		return rs, err
	}
	rs.gen = gen
	last, err := t.storedPosition(ctx, r)
	if err != nil {
		return rs, err
	}
	if last != nil {
		rs.next = t.epochs.Norm(pos{Epoch: last.Epoch, Step: last.Step + 1})
	}
	t.positions.loaded(r, last)
	rs.cursor = rs.next
	h, err := t.storedHanded(ctx, r)
	if err != nil {
		return rs, err
	}
	if h != nil {
		rs.handed, rs.anyHanded = proto.BatchKey{Epoch: h.Epoch, Step: h.Step, MicroBatch: math.MaxInt32}, true
		rs.recorded, rs.recOK = pos{Epoch: h.Epoch, Step: h.Step}, true
	}
	t.handed.loaded(r, h)
	return rs, nil
}

// storedSteps is a record of every rank's step (kvHanded, kvPositions) as
// the KV bucket held it when the service started: read once.
type storedSteps struct {
	read  bool
	ranks []*kvStep // nil when absent or of another layout
}

// stored returns rank r's step in the record key, read once into c; ok is
// false when the bucket holds no record of this layout.
func (t *rankTable) stored(ctx context.Context, key string, c *storedSteps, r int) (s *kvStep, ok bool, err error) {
	t.mu.Lock()
	read, ranks := c.read, c.ranks
	t.mu.Unlock()
	if !read {
		var got ranksRecord
		found, err := t.kv.getJSON(ctx, key, &got)
		if err != nil {
			return nil, false, err
		}
		if found && len(got.Ranks) == t.len() {
			ranks = got.Ranks
		}
		t.mu.Lock()
		c.read, c.ranks = true, ranks
		t.mu.Unlock()
	}
	if ranks == nil {
		return nil, false, nil
	}
	return ranks[r], true, nil
}

// storedPosition returns rank r's last completed step in the KV bucket:
// from the kvPositions record, or, when there is none of this layout, from
// the rank's own key of an earlier service (rank.<dp>.<mp>.step).
func (t *rankTable) storedPosition(ctx context.Context, r int) (*kvStep, error) {
	if s, ok, err := t.stored(ctx, kvPositions, &t.storedPos, r); ok || err != nil {
		return s, err
	}
	e, st, ok, err := proto.GetRankStep(ctx, t.kv.kv, r/t.mp, r%t.mp)
	if err != nil || !ok {
		return nil, err
	}
	return &kvStep{e, st}, nil
}

// storedHanded returns rank r's handed step in the KV bucket: from the
// kvHanded record, or, when there is none of this layout, from the rank's
// own key of an earlier service (rank.<dp>.<mp>.handed).
func (t *rankTable) storedHanded(ctx context.Context, r int) (*kvStep, error) {
	if s, ok, err := t.stored(ctx, kvHanded, &t.storedHand, r); ok || err != nil {
		return s, err
	}
	var h kvStep
	if ok, err := t.kv.getJSON(ctx, kvRankHanded(r/t.mp, r%t.mp), &h); err != nil || !ok {
		return nil, err
	}
	return &h, nil
}

// set replaces rank r's state (restore, before anything runs).
func (t *rankTable) set(r int, rs rankState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ranks[r] = rs
}

// get returns rank r's state.
func (t *rankTable) get(r int) rankState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ranks[r]
}

// all returns a copy of every rank's state.
func (t *rankTable) all() []rankState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]rankState(nil), t.ranks...)
}

func (t *rankTable) len() int { return len(t.ranks) }

// minCursor is the least publish cursor: where the publisher starts.
func (t *rankTable) minCursor() pos {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.minCursorLocked()
}

func (t *rankTable) minCursorLocked() pos {
	m := t.ranks[0].cursor
	for _, r := range t.ranks[1:] {
		if r.cursor.Less(m) {
			m = r.cursor
		}
	}
	return m
}

// normalize moves positions at the end of an epoch to the next one's start.
func (t *rankTable) normalize() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ranks {
		t.ranks[i].cursor = t.epochs.Norm(t.ranks[i].cursor)
		t.ranks[i].next = t.epochs.Norm(t.ranks[i].next)
	}
	t.wakeLocked() // a cursor at an epoch's end may now name the next one's start
}

// allNeed reports whether every rank's trainer needs end or later.
func (t *rankTable) allNeed(end pos) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.ranks {
		if r.next.Less(end) {
			return false
		}
	}
	return true
}

// targets normalises the publisher's queue positions next and returns the
// ranks whose next queued step is here, with their generations in gens.
func (t *rankTable) targets(here pos, next []pos, gens []int) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for r := range next {
		if next[r] = t.epochs.Norm(next[r]); next[r] == here {
			out = append(out, r)
			gens[r] = t.ranks[r].gen
		}
	}
	return out
}

// stepPublished moves rank r's cursor past step at once its last
// micro-batch of generation gen is handed over, unless a rewind moved the
// rank meanwhile.
func (t *rankTable) stepPublished(r int, at pos, gen int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rs := &t.ranks[r]; t.epochs.Norm(rs.cursor) == at && rs.gen == gen {
		before := t.minCursorLocked()
		rs.cursor = t.epochs.Norm(pos{Epoch: at.Epoch, Step: at.Step + 1})
		if before.Less(t.minCursorLocked()) { // waitTurn waits for the least cursor only
			t.wakeLocked()
		}
	}
}

// wakeLocked wakes every waitTurn.
func (t *rankTable) wakeLocked() {
	close(t.moved)
	t.moved = make(chan struct{})
}

// waitTurn blocks until every rank's cursor is at p or past it. The ranks
// share the stream's byte bound: were one rank's publisher free to run steps
// ahead, its batches (held unacknowledged by a trainer that waits for the
// others at a collective) could fill the stream while another rank's batch
// of an earlier step waits for room, and no trainer could move until
// JetStream redelivered after ack_wait. Publishing in step order keeps the
// stream to the steps the trainers need next.
func (t *rankTable) waitTurn(ctx context.Context, p pos) error {
	for {
		t.mu.Lock()
		behind := false
		for _, rs := range t.ranks {
			behind = behind || rs.cursor.Less(p)
		}
		moved := t.moved
		t.mu.Unlock()
		if !behind {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// swapConn records the connection of rank r's register and reports whether
// it is the one of its previous register.
func (t *rankTable) swapConn(r int, conn string) (same bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	same = conn != "" && t.ranks[r].conn == conn
	t.ranks[r].conn = conn
	return same
}

// setNext records the first step rank r's trainer still needs, in memory
// and, by the next write of kvPositions, in the KV bucket; with force it may
// move backwards (a register). It reports whether it set the position.
func (t *rankTable) setNext(r int, next pos, force bool) bool {
	t.mu.Lock()
	rs := &t.ranks[r]
	next = t.epochs.Norm(next)
	if !force && !rs.next.Less(next) {
		t.mu.Unlock()
		return false
	}
	from := rs.next
	rs.next, rs.known = next, true
	t.mu.Unlock()
	if t.advanced != nil && !force && from.Less(next) {
		t.advanced(r, from, next)
	}
	t.positions.set(r, t.lastCompleted(next))
	return true
}

// lastCompleted is the step before next as kvPositions records it (nil:
// next is the job's first step).
func (t *rankTable) lastCompleted(next pos) *kvStep {
	if prev, ok := t.epochs.StepBefore(next); ok {
		return &kvStep{prev.Epoch, prev.Step}
	}
	return nil
}

// hand records that key is about to be sent to rank r's fetch: when key's
// step is later than the one recorded, in the KV bucket first (kvHanded,
// written for every rank waiting then at once: handedLog), then in memory.
// When the KV write fails (err) nothing moves and the caller does not send
// the batch: the rank may acknowledge only what this service or, as the KV
// bucket records, an earlier one handed it (invariant 6).
func (t *rankTable) hand(ctx context.Context, r int, key proto.BatchKey) error {
	k := proto.BatchKey{Epoch: key.Epoch, Step: key.Step, MicroBatch: key.MicroBatch}
	t.handMu[r].Lock()
	defer t.handMu[r].Unlock()
	at := pos{Epoch: k.Epoch, Step: k.Step}
	t.mu.Lock()
	rs := &t.ranks[r]
	write := (!rs.recOK || rs.recorded.Less(at)) && t.kv != nil && t.kv.kv != nil // no KV bucket (a test's bare service): memory only
	t.mu.Unlock()
	if write {
		// With the fetch's context: a stopping service (its lease perhaps fenced
		// for good) ends the wait, and the batch is not sent.
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := t.handed.record(kctx, t.kv, r, at); err != nil {
			return err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rs = &t.ranks[r]
	if !rs.anyHanded || deliver.KeyLess(rs.handed, k) {
		rs.handed, rs.anyHanded = k, true
	}
	if write && (!rs.recOK || rs.recorded.Less(at)) {
		rs.recorded, rs.recOK = at, true
	}
	return nil
}

// rewound records rank r's new generation (in the KV bucket first) and puts
// its cursor at to.
func (t *rankTable) rewound(ctx context.Context, r, gen int, to pos) error {
	if err := t.kv.putInt(ctx, kvRankGen(r/t.mp, r%t.mp), gen); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ranks[r].gen, t.ranks[r].cursor = gen, to
	return nil
}

// resetAll puts every rank's cursor and next needed step at p (a resize).
func (t *rankTable) resetAll(p pos) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ranks {
		t.ranks[i].cursor, t.ranks[i].next = p, p
		t.ranks[i].anyHanded, t.ranks[i].recOK = false, false // the old layout's ranks were handed those
		t.positions.set(i, t.lastCompleted(p))
	}
	t.handed.reset()
	t.wakeLocked()
}

// trained returns the least position every rank's trainer still needs; ok
// is false before every rank registered or reported.
func (t *rankTable) trained() (p pos, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, r := range t.ranks {
		if !r.known {
			return pos{}, false
		}
		if i == 0 || r.next.Less(p) {
			p = r.next
		}
	}
	return p, true
}
