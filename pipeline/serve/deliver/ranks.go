package deliver

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// Epochs is what the rank table needs of the epoch book (epochs.Book):
// positions move across epoch boundaries with the epochs' step counts.
type Epochs interface {
	// Norm maps (e, steps of e) to (e+1, 0).
	Norm(p proto.Pos) proto.Pos
	// StepBefore returns the step before p; false when p is the job's first.
	StepBefore(p proto.Pos) (proto.Pos, bool)
}

// Store is the job's KV bucket as the rank table reads and writes it (serve
// gives it its fenced bucket): JSON and decimal values by key, and the
// per-rank step key of earlier services. A write fails when the bucket
// refuses it (a fenced or released lease, a full disk).
type Store interface {
	PutJSON(ctx context.Context, key string, v any) error
	// GetJSON decodes key into v; ok is false when the key does not exist.
	GetJSON(ctx context.Context, key string, v any) (ok bool, err error)
	PutInt(ctx context.Context, key string, v int) error
	// GetInt returns a decimal value; ok is false when the key does not exist.
	GetInt(ctx context.Context, key string) (v int, ok bool, err error)
	// RankStep returns rank (dp, mp)'s rank.<dp>.<mp>.step key
	// (proto.GetRankStep), which services before KeyPositions wrote.
	RankStep(ctx context.Context, dp, mp int) (epoch, step int, ok bool, err error)
	// Bucket reports whether the job's bucket exists: false in a bare
	// service of a test, where Hand records in memory only.
	Bucket() bool
}

// RankState is what the service knows of one (dp, mp) rank: a copy, read
// through its accessors.
type RankState struct {
	cursor proto.Pos // the next step to publish to the rank
	next   proto.Pos // the first step the rank's trainer still needs
	gen    int       // the replay generation of the rank's publishes
	known  bool      // the trainer registered or reported since the service started
	conn   string    // the reply inbox prefix of the rank's last register
	// handed is the last batch (epoch, step, micro-batch) a fetch of the
	// rank was answered with on the core data plane, when anyHanded: no ack
	// moves the rank past it. After a restart it is the whole step recorded
	// in the KV bucket (KeyHanded, written before the step's first batch is
	// sent), so acks of what an earlier service sent count.
	handed    proto.BatchKey
	anyHanded bool
	recorded  proto.Pos // the step KeyHanded holds for the rank, when recOK
	recOK     bool      // KeyHanded holds recorded
}

// NewRankState is a rank at cursor whose trainer needs next, at generation
// 0, with nothing handed (a test's start; Load reads a restored one).
func NewRankState(cursor, next proto.Pos) RankState {
	return RankState{cursor: cursor, next: next}
}

// Cursor is the next step to publish to the rank.
func (rs RankState) Cursor() proto.Pos { return rs.cursor }

// Next is the first step the rank's trainer still needs.
func (rs RankState) Next() proto.Pos { return rs.next }

// Gen is the replay generation of the rank's publishes.
func (rs RankState) Gen() int { return rs.gen }

// Handed is the last batch a fetch of the rank was answered with on the
// core data plane (since a restart: the whole step KeyHanded records); ok
// is false when none was.
func (rs RankState) Handed() (key proto.BatchKey, ok bool) { return rs.handed, rs.anyHanded }

// Recorded is the step KeyHanded holds for the rank; ok is false when it
// holds none.
func (rs RankState) Recorded() (at proto.Pos, ok bool) { return rs.recorded, rs.recOK }

// WithCursor is rs with its cursor at p (a restore puts it after what the
// data plane still holds).
func (rs RankState) WithCursor(p proto.Pos) RankState {
	rs.cursor = p
	return rs
}

// KVStep is a step of the job as the KV bucket records it: in KeyHanded
// (every batch of the rank up to this step may have been sent to it), in
// rank.<dp>.<mp>.handed, and in KeyPositions (the rank's last completed step).
type KVStep struct {
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
}

// RankGenKey returns the key of rank (dp, mp)'s current replay generation.
func RankGenKey(dp, mp int) string {
	return "rank." + strconv.Itoa(dp) + "." + strconv.Itoa(mp) + ".gen"
}

// rankHandedKey returns the key of the last step rank (dp, mp) was handed a
// batch of (core data plane), as services before KeyHanded wrote it: read
// when the job's bucket has no KeyHanded record of its layout.
func rankHandedKey(dp, mp int) string {
	return "rank." + strconv.Itoa(dp) + "." + strconv.Itoa(mp) + ".handed"
}

// Ranks owns every rank's positions and their persistence in the job's
// KV bucket (KeyPositions: every rank's last completed step; KeyHanded: the
// last step handed; rank.<dp>.<mp>.gen: the generation).
//
// Invariants, under mu:
//   - a cursor moves forward only when the publisher handed over a step's
//     last micro-batch of the rank's current generation (StepPublished),
//     or to wherever a rewind or a resize puts it;
//   - moved is closed (and replaced) whenever the least cursor moves
//     forward (what WaitTurn waits for: a wake-up per cursor move woke all
//     N publishers N times a step), and when a resize resets the cursors;
//   - next moves backwards only on a register (SetNext with force);
//   - a generation is written to the KV bucket before the table holds it,
//     so nothing is published with a generation a restart could reuse.
//
// Positions are normalised with the epochs' step counts: mu is taken before
// the epoch book's (epochs.Book), never after.
type Ranks struct {
	mu        sync.Mutex
	handMu    []sync.Mutex // per rank: serialises its handed records
	handed    *handedLog   // every rank's handed step in one KV key (KeyHanded)
	positions *positionLog // every rank's last completed step in one KV key (KeyPositions)
	// what the bucket held when the service started (under mu)
	storedHand, storedPos storedSteps
	ranks                 []RankState
	moved                 chan struct{}
	mp                    int
	epochs                Epochs
	kv                    Store // the job's bucket (nil: none, memory only)
	// advanced, when set (before the control handlers run), is told each
	// forward move of a rank's next needed step (the autoscaling rates).
	advanced func(r int, from, to proto.Pos)
}

// NewRanks is the table of n ranks, mp model-parallel ranks per data-parallel
// one, their positions normalised with epochs and recorded in kv (nil: in
// memory only, a test's).
func NewRanks(n, mp int, epochs Epochs, kv Store) *Ranks {
	return &Ranks{ranks: make([]RankState, n), handMu: make([]sync.Mutex, n), handed: newHandedLog(n),
		positions: newPositionLog(n), moved: make(chan struct{}), mp: mp, epochs: epochs, kv: kv}
}

// SetAdvanced makes the table tell f each forward move of a rank's next
// needed step (the autoscaling rates); set before the control handlers run.
func (t *Ranks) SetAdvanced(f func(r int, from, to proto.Pos)) { t.advanced = f }

// Load reads rank r's generation and next needed step from the KV bucket;
// both positions are at first when the rank has none recorded.
func (t *Ranks) Load(ctx context.Context, r int, first proto.Pos) (RankState, error) {
	dp, mp := r/t.mp, r%t.mp
	rs := RankState{cursor: first, next: first}
	gen, _, err := t.kv.GetInt(ctx, RankGenKey(dp, mp))
	if err != nil {
		return rs, err
	}
	rs.gen = gen
	last, err := t.storedPosition(ctx, r)
	if err != nil {
		return rs, err
	}
	if last != nil {
		rs.next = t.epochs.Norm(proto.Pos{Epoch: last.Epoch, Step: last.Step + 1})
	}
	t.positions.loaded(r, last)
	rs.cursor = rs.next
	h, err := t.storedHanded(ctx, r)
	if err != nil {
		return rs, err
	}
	if h != nil {
		rs.handed, rs.anyHanded = proto.BatchKey{Epoch: h.Epoch, Step: h.Step, MicroBatch: math.MaxInt32}, true
		rs.recorded, rs.recOK = proto.Pos{Epoch: h.Epoch, Step: h.Step}, true
	}
	t.handed.loaded(r, h)
	return rs, nil
}

// storedSteps is a record of every rank's step (KeyHanded, KeyPositions) as
// the KV bucket held it when the service started: read once.
type storedSteps struct {
	read  bool
	ranks []*KVStep // nil when absent or of another layout
}

// stored returns rank r's step in the record key, read once into c; ok is
// false when the bucket holds no record of this layout.
func (t *Ranks) stored(ctx context.Context, key string, c *storedSteps, r int) (s *KVStep, ok bool, err error) {
	t.mu.Lock()
	read, ranks := c.read, c.ranks
	t.mu.Unlock()
	if !read {
		var got RanksRecord
		found, err := t.kv.GetJSON(ctx, key, &got)
		if err != nil {
			return nil, false, err
		}
		if found && len(got.Ranks) == t.Len() {
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
// from the KeyPositions record, or, when there is none of this layout, from
// the rank's own key of an earlier service (rank.<dp>.<mp>.step).
func (t *Ranks) storedPosition(ctx context.Context, r int) (*KVStep, error) {
	if s, ok, err := t.stored(ctx, KeyPositions, &t.storedPos, r); ok || err != nil {
		return s, err
	}
	e, st, ok, err := t.kv.RankStep(ctx, r/t.mp, r%t.mp)
	if err != nil || !ok {
		return nil, err
	}
	return &KVStep{e, st}, nil
}

// storedHanded returns rank r's handed step in the KV bucket: from the
// KeyHanded record, or, when there is none of this layout, from the rank's
// own key of an earlier service (rank.<dp>.<mp>.handed).
func (t *Ranks) storedHanded(ctx context.Context, r int) (*KVStep, error) {
	if s, ok, err := t.stored(ctx, KeyHanded, &t.storedHand, r); ok || err != nil {
		return s, err
	}
	var h KVStep
	if ok, err := t.kv.GetJSON(ctx, rankHandedKey(r/t.mp, r%t.mp), &h); err != nil || !ok {
		return nil, err
	}
	return &h, nil
}

// Set replaces rank r's state (restore, before anything runs).
func (t *Ranks) Set(r int, rs RankState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ranks[r] = rs
}

// Get returns rank r's state.
func (t *Ranks) Get(r int) RankState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ranks[r]
}

// Cursor is the next step to publish to rank r.
func (t *Ranks) Cursor(r int) proto.Pos { return t.Get(r).cursor }

// Next is the first step rank r's trainer still needs.
func (t *Ranks) Next(r int) proto.Pos { return t.Get(r).next }

// Gen is the replay generation of rank r's publishes.
func (t *Ranks) Gen(r int) int { return t.Get(r).gen }

// All returns a copy of every rank's state.
func (t *Ranks) All() []RankState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]RankState(nil), t.ranks...)
}

func (t *Ranks) Len() int { return len(t.ranks) }

// MinCursor is the least publish cursor: where the publisher starts.
func (t *Ranks) MinCursor() proto.Pos {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.minCursorLocked()
}

func (t *Ranks) minCursorLocked() proto.Pos {
	m := t.ranks[0].cursor
	for _, r := range t.ranks[1:] {
		if r.cursor.Less(m) {
			m = r.cursor
		}
	}
	return m
}

// Normalize moves positions at the end of an epoch to the next one's start.
func (t *Ranks) Normalize() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.ranks {
		t.ranks[i].cursor = t.epochs.Norm(t.ranks[i].cursor)
		t.ranks[i].next = t.epochs.Norm(t.ranks[i].next)
	}
	t.wakeLocked() // a cursor at an epoch's end may now name the next one's start
}

// AllNeed reports whether every rank's trainer needs end or later.
func (t *Ranks) AllNeed(end proto.Pos) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.ranks {
		if r.next.Less(end) {
			return false
		}
	}
	return true
}

// Targets normalises the publisher's queue positions next and returns the
// ranks whose next queued step is here, with their generations in gens.
func (t *Ranks) Targets(here proto.Pos, next []proto.Pos, gens []int) []int {
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

// StepPublished moves rank r's cursor past step at once its last
// micro-batch of generation gen is handed over, unless a rewind moved the
// rank meanwhile.
func (t *Ranks) StepPublished(r int, at proto.Pos, gen int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rs := &t.ranks[r]; t.epochs.Norm(rs.cursor) == at && rs.gen == gen {
		before := t.minCursorLocked()
		rs.cursor = t.epochs.Norm(proto.Pos{Epoch: at.Epoch, Step: at.Step + 1})
		if before.Less(t.minCursorLocked()) { // WaitTurn waits for the least cursor only
			t.wakeLocked()
		}
	}
}

// wakeLocked wakes every WaitTurn.
func (t *Ranks) wakeLocked() {
	close(t.moved)
	t.moved = make(chan struct{})
}

// WaitTurn blocks until every rank's cursor is at p or past it. The ranks
// share the stream's byte bound: were one rank's publisher free to run steps
// ahead, its batches (held unacknowledged by a trainer that waits for the
// others at a collective) could fill the stream while another rank's batch
// of an earlier step waits for room, and no trainer could move until
// JetStream redelivered after ack_wait. Publishing in step order keeps the
// stream to the steps the trainers need next.
func (t *Ranks) WaitTurn(ctx context.Context, p proto.Pos) error {
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

// SwapConn records the connection of rank r's register and reports whether
// it is the one of its previous register.
func (t *Ranks) SwapConn(r int, conn string) (same bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	same = conn != "" && t.ranks[r].conn == conn
	t.ranks[r].conn = conn
	return same
}

// SetNext records the first step rank r's trainer still needs, in memory
// and, by the next write of KeyPositions, in the KV bucket; with force it may
// move backwards (a register). It reports whether it set the position.
func (t *Ranks) SetNext(r int, next proto.Pos, force bool) bool {
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

// lastCompleted is the step before next as KeyPositions records it (nil:
// next is the job's first step).
func (t *Ranks) lastCompleted(next proto.Pos) *KVStep {
	if prev, ok := t.epochs.StepBefore(next); ok {
		return &KVStep{prev.Epoch, prev.Step}
	}
	return nil
}

// Hand records that key is about to be sent to rank r's fetch: when key's
// step is later than the one recorded, in the KV bucket first (KeyHanded,
// written for every rank waiting then at once: handedLog), then in memory.
// When the KV write fails (err) nothing moves and the caller does not send
// the batch: the rank may acknowledge only what this service or, as the KV
// bucket records, an earlier one handed it (invariant 6).
func (t *Ranks) Hand(ctx context.Context, r int, key proto.BatchKey) error {
	k := proto.BatchKey{Epoch: key.Epoch, Step: key.Step, MicroBatch: key.MicroBatch}
	t.handMu[r].Lock()
	defer t.handMu[r].Unlock()
	at := proto.Pos{Epoch: k.Epoch, Step: k.Step}
	t.mu.Lock()
	rs := &t.ranks[r]
	write := (!rs.recOK || rs.recorded.Less(at)) && t.kv != nil && t.kv.Bucket() // no KV bucket (a test's bare service): memory only
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
	if !rs.anyHanded || KeyLess(rs.handed, k) {
		rs.handed, rs.anyHanded = k, true
	}
	if write && (!rs.recOK || rs.recorded.Less(at)) {
		rs.recorded, rs.recOK = at, true
	}
	return nil
}

// CheckAck returns nil when rank r may acknowledge k on the core data plane
// (a plan of microBatches micro-batches a step): a batch of a step the rank
// already completed (a duplicate: clients send recent acks again after a
// reconnect), or a batch up to the last one handed to the rank (its fetch
// was answered with it or a later batch, by this service or, as the KV
// bucket recorded, by an earlier one). An ack means "every batch up to k is
// applied" (docs/protocol.md section 11), so it moves the rank at most to
// the step after the last batch handed to it, never over a batch no fetch
// of the rank got (invariant 6).
func (t *Ranks) CheckAck(r int, k proto.BatchKey, microBatches int) error {
	if k.MicroBatch >= microBatches || t.epochs.Norm(proto.Pos{Epoch: k.Epoch, Step: k.Step}) != (proto.Pos{Epoch: k.Epoch, Step: k.Step}) {
		return fmt.Errorf("serve: ack of %v: outside the plan: %w", k, proto.ErrControl)
	}
	rs := t.Get(r)
	if (proto.Pos{Epoch: k.Epoch, Step: k.Step}).Less(t.epochs.Norm(rs.next)) {
		return nil
	}
	if !rs.anyHanded || KeyLess(rs.handed, proto.BatchKey{Epoch: k.Epoch, Step: k.Step, MicroBatch: k.MicroBatch}) {
		return fmt.Errorf("serve: ack of %v, which was not handed to rank %d (last handed: %v, any: %v): %w",
			k, r, rs.handed, rs.anyHanded, proto.ErrControl)
	}
	return nil
}

// Rewound records rank r's new generation (in the KV bucket first) and puts
// its cursor at to.
func (t *Ranks) Rewound(ctx context.Context, r, gen int, to proto.Pos) error {
	if err := t.kv.PutInt(ctx, RankGenKey(r/t.mp, r%t.mp), gen); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ranks[r].gen, t.ranks[r].cursor = gen, to
	return nil
}

// ResetAll puts every rank's cursor and next needed step at p (a resize).
func (t *Ranks) ResetAll(p proto.Pos) {
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

// Trained returns the least position every rank's trainer still needs; ok
// is false before every rank registered or reported.
func (t *Ranks) Trained() (p proto.Pos, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, r := range t.ranks {
		if !r.known {
			return proto.Pos{}, false
		}
		if i == 0 || r.next.Less(p) {
			p = r.next
		}
	}
	return p, true
}

// RunPositions writes KeyPositions whenever a rank's last completed step
// changed, at most once per interval, until ctx ends.
func (t *Ranks) RunPositions(ctx context.Context, interval time.Duration) {
	t.positions.run(ctx, t.kv, interval)
}

// FlushPositions writes KeyPositions now when it changed since the last
// write (a stopping service's last acks).
func (t *Ranks) FlushPositions(ctx context.Context) error { return t.positions.flush(ctx, t.kv) }

// Rewrite writes every rank's records back from memory into a recreated
// bucket: KeyHanded, KeyPositions and each rank's generation.
func (t *Ranks) Rewrite(ctx context.Context) error {
	ranks := t.All()
	handed := RanksRecord{Ranks: make([]*KVStep, len(ranks))}
	positions := RanksRecord{Ranks: make([]*KVStep, len(ranks))}
	for r, rs := range ranks {
		if rs.recOK {
			handed.Ranks[r] = &KVStep{rs.recorded.Epoch, rs.recorded.Step}
		}
		positions.Ranks[r] = t.lastCompleted(rs.next)
	}
	if err := t.kv.PutJSON(ctx, KeyHanded, handed); err != nil {
		return err
	}
	if err := t.kv.PutJSON(ctx, KeyPositions, positions); err != nil {
		return err
	}
	for r, rs := range ranks {
		if err := t.kv.PutInt(ctx, RankGenKey(r/t.mp, r%t.mp), rs.gen); err != nil {
			return err
		}
	}
	return nil
}
