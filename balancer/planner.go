package balancer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
)

// PlannerVersion names the planning algorithm in [Planner.Hash]. Bump it
// with every change that can give a different plan for the same items and
// Config, so that a restart refuses a plan it cannot reproduce.
const PlannerVersion = 1

// Planner plans an epoch one lookahead window at a time: [Start] sorts out
// the items and cuts the global batches (so the step count is known at
// once), each [Planner.PlanNext] plans the next window's steps. The steps
// are exactly [Build]'s, which is Start plus PlanNext until done. A Planner
// is not safe for concurrent use; [Planner.Plan]'s Steps are appended to
// (never moved: their capacity is the epoch's), so a prefix read after
// PlanNext returned stays valid while later windows are planned.
type Planner struct {
	b       *builder
	batches []batch
	wins    [][2]int // (first step, steps) of each window; the padded tail is its own
	next    int      // the next window to plan
	first   []int32  // the baselines' padding samples
	hash    string
}

// Start checks cfg, rejects the items that cannot be planned and cuts the
// rest into global batches; it plans no step.
func Start(items []Item, cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(items) > 1<<31-1 {
		return nil, fmt.Errorf("balancer: %d items: %w", len(items), ErrInvalidConfig)
	}
	cfg.Model = cfg.model()
	b := &builder{cfg: cfg, items: items, costs: cfg.Model.Costs(items)}
	b.plan = &Plan{Config: cfg, items: items}
	p := &Planner{b: b, batches: b.slice(b.reject())}
	b.plan.Steps = make([]Step, 0, len(p.batches))
	if cfg.Strategy != StrategyMmfeed {
		p.wins = [][2]int{{0, len(p.batches)}}
		for _, bt := range p.batches { // DistributedSampler pads with the epoch's first samples
			p.first = append(p.first, bt.items...)
			if len(p.first) >= max(cfg.GlobalBatch, cfg.DP*cfg.MicroBatches) {
				break
			}
		}
		return p, nil
	}
	part, err := NewPartitioner(cfg.partitionConfig())
	if err != nil {
		return nil, err
	}
	b.part = part
	full := len(p.batches)
	if full > 0 && p.batches[full-1].pad {
		full--
	}
	for start, size := range windows(full, cfg.Lookahead) {
		p.wins = append(p.wins, [2]int{start, size})
	}
	if full < len(p.batches) {
		p.wins = append(p.wins, [2]int{full, 1})
	}
	return p, nil
}

// Steps returns the epoch's step count (known before any is planned).
func (p *Planner) Steps() int { return len(p.batches) }

// Windows returns the number of windows PlanNext plans.
func (p *Planner) Windows() int { return len(p.wins) }

// Window returns window i's first step and step count.
func (p *Planner) Window(i int) (start, size int) { return p.wins[i][0], p.wins[i][1] }

// Planned returns the number of steps planned so far.
func (p *Planner) Planned() int { return len(p.b.plan.Steps) }

// Done reports whether every window is planned.
func (p *Planner) Done() bool { return p.next == len(p.wins) }

// Plan returns the plan so far: its Dropped and Rejected are final from
// Start on, its Steps are the steps planned, and MaxDelay and MinDelay are
// set once Done.
func (p *Planner) Plan() *Plan { return p.b.plan }

// PlanNext plans the next window and reports whether windows remain.
func (p *Planner) PlanNext() (more bool, err error) {
	if p.Done() {
		return false, nil
	}
	start, size := p.Window(p.next)
	b := p.b
	switch {
	case b.cfg.Strategy != StrategyMmfeed:
		for _, bt := range p.batches {
			if err := b.baselineStep(bt, p.first); err != nil {
				return false, err
			}
		}
	case p.batches[start].pad:
		err = b.mmfeedStep(start, arrivals(p.batches[start]))
	default:
		err = b.planWindow(start, p.batches[start:start+size])
	}
	if err != nil {
		return false, err
	}
	if p.next++; p.next == 1 {
		p.hash = p.inputHash()
	}
	if p.Done() {
		b.plan.MaxDelay, b.plan.MinDelay = delays(b.plan.Steps)
	}
	return !p.Done(), nil
}

// Hash identifies the plan before it is complete: the hex SHA-256 of
// PlannerVersion, the Config (its model included), every item's id and
// features in order, and the first window's plan with the dropped and
// rejected items ([Plan.WriteJSONL]). The plan is a pure function of the
// items and Config, so equal hashes mean identical plans as long as
// PlannerVersion is bumped with the algorithm; the first window's lines
// catch most changes that were not. Empty before the first PlanNext (and for
// an epoch without steps, whose plan the dropped and rejected lists are).
func (p *Planner) Hash() string {
	if p.hash == "" && len(p.wins) == 0 {
		p.hash = p.inputHash()
	}
	return p.hash
}

func (p *Planner) inputHash() string {
	h := sha256.New()
	cfg, _ := json.Marshal(p.b.cfg) // a Config always marshals
	var buf []byte
	buf = binary.AppendUvarint(buf, PlannerVersion)
	buf = binary.AppendUvarint(buf, uint64(len(cfg)))
	buf = append(buf, cfg...)
	buf = binary.AppendUvarint(buf, uint64(len(p.b.items)))
	h.Write(buf)
	for _, it := range p.b.items {
		buf = binary.AppendUvarint(buf[:0], uint64(len(it.ID)))
		buf = append(buf, it.ID...)
		buf = binary.AppendVarint(buf, int64(it.TextTokens))
		buf = binary.AppendVarint(buf, int64(it.ImageTokens))
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(it.Complexity))
		h.Write(buf)
	}
	first := *p.b.plan
	_ = first.WriteJSONL(h) // a hash.Hash never fails to write
	return hex.EncodeToString(h.Sum(nil))
}
