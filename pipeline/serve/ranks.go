package serve

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// pos is a position in the job: (epoch, step). (e, steps of e) and (e+1, 0)
// name the same place; epochBook.norm makes them equal.
type pos struct{ Epoch, Step int }

func (p pos) less(q pos) bool {
	return p.Epoch < q.Epoch || (p.Epoch == q.Epoch && p.Step < q.Step)
}

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
	// unsaved: the KV write of next failed (a full disk, an outage); the
	// next setNext to the same position writes it again.
	unsaved bool
}

// handedStep is the KV value of rank.<dp>.<mp>.handed: every batch of the
// rank up to this step may have been sent to it.
type handedStep struct {
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
// KV bucket (rank.<dp>.<mp>.step: the last completed step; rank.<dp>.<mp>.gen:
// the generation).
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
// epochBook.mu, never after.
type rankTable struct {
	mu     sync.Mutex
	handMu []sync.Mutex // per rank: serialises its handed records
	handed *handedLog   // every rank's handed step in one KV key (kvHanded)
	// hread: the stored kvHanded record was read (hrec, nil when absent or
	// of another layout).
	hread  bool
	hrec   *handedRecord
	ranks  []rankState
	moved  chan struct{}
	mp     int
	epochs *epochBook
	kv     *state // the Service's, set up before the table is used
	// advanced, when set (before the control handlers run), is told each
	// forward move of a rank's next needed step (the autoscaling rates).
	advanced func(r int, from, to pos)
}

func newRankTable(n, mp int, epochs *epochBook, kv *state) *rankTable {
	return &rankTable{ranks: make([]rankState, n), handMu: make([]sync.Mutex, n), handed: newHandedLog(n),
		moved: make(chan struct{}), mp: mp, epochs: epochs, kv: kv}
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
	e, st, ok, err := proto.GetRankStep(ctx, t.kv.kv, dp, mp)
	if err != nil {
		return rs, err
	}
	if ok {
		rs.next = t.epochs.norm(pos{e, st + 1})
	}
	rs.cursor = rs.next
	h, err := t.storedHanded(ctx, r)
	if err != nil {
		return rs, err
	}
	if h != nil {
		rs.handed, rs.anyHanded = proto.BatchKey{Epoch: h.Epoch, Step: h.Step, MicroBatch: math.MaxInt32}, true
		rs.recorded, rs.recOK = pos{h.Epoch, h.Step}, true
	}
	t.handed.loaded(r, h)
	return rs, nil
}

// storedHanded returns rank r's handed step in the KV bucket: from the
// kvHanded record (read once), or, when there is none of this layout, from
// the rank's own key of an earlier service (rank.<dp>.<mp>.handed).
func (t *rankTable) storedHanded(ctx context.Context, r int) (*handedStep, error) {
	t.mu.Lock()
	read, rec := t.hread, t.hrec
	t.mu.Unlock()
	if !read {
		var got handedRecord
		ok, err := t.kv.getJSON(ctx, kvHanded, &got)
		if err != nil {
			return nil, err
		}
		if ok && len(got.Ranks) == t.len() {
			rec = &got
		}
		t.mu.Lock()
		t.hread, t.hrec = true, rec
		t.mu.Unlock()
	}
	if rec != nil {
		return rec.Ranks[r], nil
	}
	var h handedStep
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
		if r.cursor.less(m) {
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
		t.ranks[i].cursor = t.epochs.norm(t.ranks[i].cursor)
		t.ranks[i].next = t.epochs.norm(t.ranks[i].next)
	}
	t.wakeLocked() // a cursor at an epoch's end may now name the next one's start
}

// allNeed reports whether every rank's trainer needs end or later.
func (t *rankTable) allNeed(end pos) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.ranks {
		if r.next.less(end) {
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
		if next[r] = t.epochs.norm(next[r]); next[r] == here {
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
	if rs := &t.ranks[r]; t.epochs.norm(rs.cursor) == at && rs.gen == gen {
		before := t.minCursorLocked()
		rs.cursor = t.epochs.norm(pos{at.Epoch, at.Step + 1})
		if before.less(t.minCursorLocked()) { // waitTurn waits for the least cursor only
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
			behind = behind || rs.cursor.less(p)
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
// and as the KV rank step; with force it may move backwards (a register).
// The KV write is not cut short by ctx's end (only bounded). It reports whether the position moved; err is the KV write's.
func (t *rankTable) setNext(ctx context.Context, r int, next pos, force bool) (bool, error) {
	t.mu.Lock()
	rs := &t.ranks[r]
	next = t.epochs.norm(next)
	retry := rs.unsaved && rs.next == next
	if !force && !rs.next.less(next) && !retry {
		t.mu.Unlock()
		return false, nil
	}
	from := rs.next
	rs.next, rs.known = next, true
	t.mu.Unlock()
	if t.advanced != nil && !force && from.less(next) {
		t.advanced(r, from, next)
	}
	err := t.save(ctx, r, next)
	t.mu.Lock()
	if r < len(t.ranks) && t.ranks[r].next == next {
		t.ranks[r].unsaved = err != nil
	}
	t.mu.Unlock()
	return !retry, err
}

// save writes rank r's position next to the KV bucket.
func (t *rankTable) save(ctx context.Context, r int, next pos) error {
	prev, hasPrev := t.epochs.stepBefore(next)
	// The position is taken: record it even when ctx ends now (the service
	// stopping after the job's last done), within a bound.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	dp, mp := r/t.mp, r%t.mp
	if hasPrev {
		return proto.PutRankStep(kctx, t.kv.kv, dp, mp, prev.Epoch, prev.Step)
	}
	return t.kv.delete(kctx, proto.KVRankStep(dp, mp))
}

// hand records that key is about to be sent to rank r's fetch: in memory,
// and, when key's step is later than the one recorded, in the KV bucket
// (kvHanded, written for every rank waiting then at once: handedLog) first. The memory moves even when the KV write
// fails (err): the batch is sent anyway, and only a restart before the
// next recorded step forgets it.
func (t *rankTable) hand(ctx context.Context, r int, key proto.BatchKey) error {
	k := proto.BatchKey{Epoch: key.Epoch, Step: key.Step, MicroBatch: key.MicroBatch}
	t.handMu[r].Lock()
	defer t.handMu[r].Unlock()
	t.mu.Lock()
	rs := &t.ranks[r]
	if !rs.anyHanded || keyLess(rs.handed, k) {
		rs.handed, rs.anyHanded = k, true
	}
	at := pos{k.Epoch, k.Step}
	write := !rs.recOK || rs.recorded.less(at)
	t.mu.Unlock()
	if !write || t.kv == nil || t.kv.kv == nil { // no KV bucket (a test's bare service): memory only
		return nil
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := t.handed.record(kctx, t.kv, r, at); err != nil {
		return err
	}
	t.mu.Lock()
	if rs := &t.ranks[r]; !rs.recOK || rs.recorded.less(at) {
		rs.recorded, rs.recOK = at, true
	}
	t.mu.Unlock()
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
		if i == 0 || r.next.less(p) {
			p = r.next
		}
	}
	return p, true
}
