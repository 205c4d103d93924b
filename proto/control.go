package proto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// MaxControlBytes bounds a control message's JSON.
const MaxControlBytes = 64 << 10

// Layout is a job's world layout, the reference a Register is checked
// against.
type Layout struct {
	DP, MP    int
	Placement string // PlacementColocated | PlacementModality
	// PP is the trainer's pipeline stages per dp rank (0 or 1: none); only
	// stage 0 of each dp rank registers and receives data.
	PP int
}

// Stages returns PP, 1 when unset.
func (l Layout) Stages() int { return max(l.PP, 1) }

// Validate checks dp ≥ 1, mp ≥ 1 and the placement (modality needs mp = 2).
func (l Layout) Validate() error {
	if l.DP < 1 || l.MP < 1 {
		return fmt.Errorf("proto: layout dp=%d mp=%d: both must be ≥ 1: %w", l.DP, l.MP, ErrLayout)
	}
	if l.PP < 0 || (l.PP > 1 && l.MP != 1) {
		return fmt.Errorf("proto: layout pp=%d mp=%d: pp must be ≥ 0, and pipeline stages need mp = 1: %w", l.PP, l.MP, ErrLayout)
	}
	_, err := ModalityFor(l.Placement, l.MP, 0)
	return err
}

// Register is sent by every trainer rank on mmfeed.<job>.ctl.register
// (request/reply) before it consumes; the service answers RegisterReply.
type Register struct {
	Job    string `json:"job"`
	DPRank int    `json:"dp_rank"`
	MPRank int    `json:"mp_rank"`
	DP     int    `json:"dp"`
	MP     int    `json:"mp"`
	// PP is the trainer's pipeline stages (0 or 1: none); a pipelined
	// trainer registers from stage 0 only, which receives the data.
	PP int `json:"pp,omitempty"`
	// Placement is "colocated" or "modality".
	Placement string `json:"placement"`
	// Epoch and ResumeStep: the first (epoch, step) the rank still needs;
	// 0, 0 for a fresh start.
	Epoch      int `json:"epoch"`
	ResumeStep int `json:"resume_step"`
}

// Refusal codes of a RegisterReply that is not OK: what the trainer does
// next.
const (
	// RefusedNotReady: the epoch is still being planned; register again
	// (the service is working on it). Not the end of the data.
	RefusedNotReady = "not_ready"
	// RefusedEnd: the epoch is past the job's last one: the end of the data.
	RefusedEnd = "end"
	// RefusedInvalid: the register itself is wrong (job, layout, ranks,
	// resume step, malformed); registering again the same way cannot work.
	RefusedInvalid = "invalid"
	// RefusedFailed: the service could not serve the rank just now (a
	// store or stream error); register again later.
	RefusedFailed = "failed"
)

// RegisterReply answers a Register. DP, MP and Placement (the job's layout)
// are set in every reply, also a refusal, so a client that does not know the
// layout can learn it and register again.
type RegisterReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Code says why a register was refused (one of the Refused* codes):
	// "not_ready" and "failed" mean retry, "end" the end of the data.
	Code string `json:"code,omitempty"`
	// Retry is Code == not_ready or failed: the refusal is temporary,
	// register again later.
	Retry     bool   `json:"retry,omitempty"`
	DP        int    `json:"dp,omitempty"`
	MP        int    `json:"mp,omitempty"`
	PP        int    `json:"pp,omitempty"`
	Placement string `json:"placement,omitempty"`
	// PlanHash identifies the plan (dataset, seed, epoch, layout, config); a
	// rank that resumes compares it with the one it checkpointed.
	PlanHash string `json:"plan_hash,omitempty"`
	// Steps and MicroBatches: every dp rank gets Steps steps of MicroBatches
	// micro-batches in this epoch.
	Steps        int `json:"steps"`
	MicroBatches int `json:"micro_batches"`
	Epoch        int `json:"epoch"`
	// Pack says the plan is for packed micro-batches (--pack): the trainer
	// must pack them too and refuses to run otherwise.
	Pack bool `json:"pack,omitempty"`
	// VocabSize is the vocabulary size of the tokenizer that made the
	// batches' ids (the mmfeed.vocab_size schema metadata), 0 when unknown: a
	// trainer sizes (or resizes) its text embedding from it before the first
	// batch arrives.
	VocabSize int `json:"vocab_size,omitempty"`
	// Modality is the column set this rank receives ("all|vision|text").
	Modality Modality `json:"modality,omitempty"`
	// Stream and Consumer name the JetStream stream and this rank's durable
	// consumer; Subject is the rank's batch subject.
	Stream   string `json:"stream,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Subject  string `json:"subject,omitempty"`
	// DataPlane is DataPlaneCore or DataPlaneJetStream; absent means
	// JetStream (services before the core data plane). On the core data
	// plane the rank asks for batches on FetchSubject and acknowledges them
	// on AckSubject; Stream, Consumer and Subject are then unused.
	DataPlane    string `json:"data_plane,omitempty"`
	FetchSubject string `json:"fetch_subject,omitempty"`
	AckSubject   string `json:"ack_subject,omitempty"`
	// Generation is the rank's replay generation when it registered: the
	// core-plane client drops a batch of an older one (a copy sent before a
	// rewind) from its first fetch on.
	Generation int `json:"generation,omitempty"`
}

// ResendReply answers a resend sent as a request (the Python client's):
// OK once the service has it, the rewind follows; otherwise Error says why
// it was refused.
type ResendReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Feedback is published by a trainer rank after each step on
// mmfeed.<job>.ctl.feedback; the balancer calibrates its cost model from it.
type Feedback struct {
	Job             string  `json:"job"`
	Epoch           int     `json:"epoch"`
	Step            int     `json:"step"`
	DPRank          int     `json:"dp_rank"`
	MPRank          int     `json:"mp_rank"`
	ComputeSeconds  float64 `json:"compute_seconds"`
	DataWaitSeconds float64 `json:"data_wait_seconds"`
	Samples         int     `json:"samples"`
}

// Done is published by a trainer rank on mmfeed.<job>.ctl.done when it has
// taken every step of an epoch.
type Done struct {
	Job    string `json:"job"`
	Epoch  int    `json:"epoch"`
	DPRank int    `json:"dp_rank"`
	MPRank int    `json:"mp_rank"`
	Steps  int    `json:"steps"`
}

// Resend asks the service (mmfeed.<job>.ctl.resend) to publish a batch again,
// with a higher generation, after the rank failed to reassemble or decode it.
type Resend struct {
	Job        string `json:"job"`
	Epoch      int    `json:"epoch"`
	Step       int    `json:"step"`
	MicroBatch int    `json:"micro_batch"`
	DPRank     int    `json:"dp_rank"`
	MPRank     int    `json:"mp_rank"`
	Reason     string `json:"reason"`
}

// ValidateAgainst checks a Register against the job's name and layout and
// returns a precise ErrLayout error naming every mismatch it finds first.
func (r Register) ValidateAgainst(job string, l Layout) error {
	if err := ValidateJob(r.Job); err != nil {
		return fmt.Errorf("proto: register: %w: %w", err, ErrControl)
	}
	if r.Job != job {
		return fmt.Errorf("proto: register: job %q, this service runs %q: %w", r.Job, job, ErrLayout)
	}
	if r.DP != l.DP || r.MP != l.MP {
		return fmt.Errorf("proto: register: trainer layout dp=%d mp=%d (world %d) does not match job layout dp=%d mp=%d (world %d): %w",
			r.DP, r.MP, r.DP*r.MP, l.DP, l.MP, l.DP*l.MP, ErrLayout)
	}
	if max(r.PP, 1) != l.Stages() {
		return fmt.Errorf("proto: register: trainer pp=%d does not match the job's pp=%d (serve --pp): the plan levels micro-batches for the job's pipeline: %w",
			max(r.PP, 1), l.Stages(), ErrLayout)
	}
	if r.Placement != l.Placement {
		return fmt.Errorf("proto: register: trainer placement %q does not match job placement %q: %w", r.Placement, l.Placement, ErrLayout)
	}
	if r.DPRank < 0 || r.DPRank >= l.DP {
		return fmt.Errorf("proto: register: dp_rank %d out of range [0,%d): %w", r.DPRank, l.DP, ErrLayout)
	}
	if r.MPRank < 0 || r.MPRank >= l.MP {
		return fmt.Errorf("proto: register: mp_rank %d out of range [0,%d): %w", r.MPRank, l.MP, ErrLayout)
	}
	if r.Epoch < 0 || r.ResumeStep < 0 {
		return fmt.Errorf("proto: register: epoch %d, resume_step %d must be ≥ 0: %w", r.Epoch, r.ResumeStep, ErrControl)
	}
	return l.Validate()
}

// Validate checks ranges and finiteness.
func (f Feedback) Validate() error {
	if err := ValidateJob(f.Job); err != nil {
		return fmt.Errorf("proto: feedback: %w: %w", err, ErrControl)
	}
	if f.Epoch < 0 || f.Step < 0 || f.DPRank < 0 || f.MPRank < 0 || f.Samples < 0 {
		return fmt.Errorf("proto: feedback: negative epoch/step/rank/samples %+v: %w", f, ErrControl)
	}
	for _, v := range []float64{f.ComputeSeconds, f.DataWaitSeconds} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("proto: feedback: seconds %v not finite and ≥ 0: %w", v, ErrControl)
		}
	}
	return nil
}

// Validate checks the job name and ranges.
func (d Done) Validate() error {
	if err := ValidateJob(d.Job); err != nil {
		return fmt.Errorf("proto: done: %w: %w", err, ErrControl)
	}
	if d.Epoch < 0 || d.DPRank < 0 || d.MPRank < 0 || d.Steps < 0 {
		return fmt.Errorf("proto: done: negative field %+v: %w", d, ErrControl)
	}
	return nil
}

// Validate checks the job name and ranges.
func (r Resend) Validate() error {
	k := BatchKey{Job: r.Job, Epoch: r.Epoch, Step: r.Step, MicroBatch: r.MicroBatch, DPRank: r.DPRank, MPRank: r.MPRank}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("proto: resend: %w: %w", err, ErrControl)
	}
	return nil
}

// validator is implemented by every control message.
type validator interface{ Validate() error }

// DecodeControl strictly decodes one control message into v (unknown fields
// are errors, size ≤ MaxControlBytes) and validates it when v has a
// Validate method. Errors wrap ErrControl.
func DecodeControl(data []byte, v any) error {
	if len(data) > MaxControlBytes {
		return fmt.Errorf("proto: control message of %d bytes > %d: %w", len(data), MaxControlBytes, ErrControl)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("proto: control message: %v: %w", err, ErrControl)
	}
	if dec.More() {
		return fmt.Errorf("proto: control message: trailing data: %w", ErrControl)
	}
	if val, ok := v.(validator); ok {
		return val.Validate()
	}
	return nil
}

// EncodeControl marshals a control message after validating it.
func EncodeControl(v any) ([]byte, error) {
	if val, ok := v.(validator); ok {
		if err := val.Validate(); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("proto: control message: %w", err)
	}
	return b, nil
}
