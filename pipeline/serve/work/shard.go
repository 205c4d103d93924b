package work

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ShardWorkConfig configures ShardWorkers.
type ShardWorkConfig struct {
	// NATS is the deployment the workers (`mmfeed serve --role worker`) use.
	NATS natsenv.Config
	// Job names the run's work items, result subject and buckets ("":
	// "shard-" and 8 random hex digits, so that runs never share them).
	Job string
	// Ahead is how many steps past the one being written are issued (0: 4).
	Ahead int
	// AckWait is how long a worker may go without renewing an item before
	// it is redelivered to another worker (0: 2 s). It is the work queue's
	// setting, shared with any planner using the same deployment.
	AckWait time.Duration
	// Replicas of the work queue and buckets (0: 1).
	Replicas int
	// Logger receives the log (nil: slog.Default()).
	Logger *slog.Logger
}

// ShardWorkers is the planner side of `mmfeed shard --nats`: its Run is a
// pipeline.StepSource whose rows are built by preprocessing workers. It
// issues one batch item per (step, dp rank, micro-batch) of the plan to the
// work queue (the items a serve planner issues, mp 1), collects the
// workers' encoded records, decodes them and emits each step's rows in plan
// order, whatever order the workers finish in. A worker that dies leaves
// its item to another worker after the ack wait, so no sample is lost.
// Decode failures the workers quarantine are copied into the Prepared's
// quarantine. Close releases the run's queue items, buckets and connection.
type ShardWorkers struct {
	cfg  ShardWorkConfig
	prep *pipeline.Prepared
	log  *slog.Logger
	nc   *nats.Conn
	js   jetstream.JetStream
	qkv  jetstream.KeyValue
	work *Planner
	subs []*nats.Subscription
	// failed are the samples the workers returned with weight 0 though
	// planned (their quarantine records are in qkv).
	failed map[string]bool
}

// NewShardWorkers connects to the deployment, creates the work queue (if no
// planner did), puts prep's preprocessing config and tokenizer in the run's
// work bucket and subscribes to the results. The workers must read prep's
// input at the same path.
func NewShardWorkers(ctx context.Context, cfg ShardWorkConfig, prep *pipeline.Prepared) (_ *ShardWorkers, err error) {
	if !cfg.NATS.External() {
		return nil, fmt.Errorf("serve: shard workers need a NATS URL: %w", natsenv.ErrInvalidConfig)
	}
	if cfg.NATS.ReconnectWait <= 0 {
		cfg.NATS.ReconnectWait = 250 * time.Millisecond
	}
	if err := cfg.NATS.Validate(); err != nil {
		return nil, err
	}
	cfg.Ahead = cmp.Or(cfg.Ahead, 4)
	cfg.AckWait = cmp.Or(cfg.AckWait, 2*time.Second)
	if cfg.Job == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Job = "shard-" + hex.EncodeToString(b[:])
	}
	if err := proto.ValidateJob(cfg.Job); err != nil {
		return nil, err
	}
	sw := &ShardWorkers{cfg: cfg, prep: prep, log: cmp.Or(cfg.Logger, slog.Default()), failed: map[string]bool{}}
	if sw.nc, err = natsenv.Connect(cfg.NATS, nil, nil, sw.log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sw.Close()
		}
	}()
	if sw.js, err = jetstream.New(sw.nc); err != nil {
		return nil, fmt.Errorf("serve: jetstream: %w", err)
	}
	wc, tok, err := NewConfig(prep.Config)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := EnsureQueue(sctx, sw.js, cfg.Replicas, cfg.AckWait); err != nil {
		return nil, err
	}
	hash, err := EnsureBucket(sctx, sw.js, cfg.Job, cfg.Replicas, wc, tok)
	if err != nil {
		return nil, err
	}
	if sw.qkv, err = (natsenv.Assets{Job: cfg.Job, Replicas: cfg.Replicas}).EnsureQuarantine(sctx, sw.js); err != nil {
		return nil, fmt.Errorf("serve: quarantine bucket: %w", err)
	}
	if sw.work, err = NewPlanner(cfg.Job, 1, cfg.Ahead, sw.js, sw.nc, hash, sw.log); err != nil {
		return nil, err
	}
	if err := sw.work.Reset(sctx); err != nil {
		return nil, err
	}
	if sw.subs, err = sw.work.Subscribe(); err != nil {
		return nil, err
	}
	sw.log.Debug("shard: batch items go to the work queue", "stream", Stream, "job", cfg.Job, "config", hash)
	return sw, nil
}

// Job is the run's job name (its subjects and buckets).
func (sw *ShardWorkers) Job() string { return sw.cfg.Job }

// Run issues the plan's batch items and emits its steps' rows in plan order
// as the workers deliver them (pipeline.StepSource).
func (sw *ShardWorkers) Run(ctx context.Context, plan *balancer.Plan, emit func(pipeline.StepBatch) error) error {
	src := ItemSource{Features: &sw.prep.Features, Epoch: plan.Config.Epoch, Meta: sw.meta(plan), Image: sw.prep.Config.Image}
	all := func(int) bool { return true }
	issued := 0
	for k, st := range plan.Steps {
		for ; issued < len(plan.Steps) && issued <= k+sw.cfg.Ahead; issued++ {
			if err := sw.work.IssueStep(ctx, src, plan, plan.Steps[issued], all, false); err != nil {
				return err
			}
		}
		sb, err := sw.collect(ctx, src.Epoch, st)
		sw.work.ForgetStep(src.Epoch, st.Index)
		if err != nil {
			return err
		}
		if err := emit(sb); err != nil {
			return err
		}
	}
	return sw.importQuarantine(ctx)
}

// meta is the batch metadata of a shard item (mp 1: modality all).
func (sw *ShardWorkers) meta(plan *balancer.Plan) func(step, r int) (proto.BatchMeta, error) {
	base := sw.prep.BatchMeta(sw.cfg.Job, plan.Config.Epoch, proto.ModalityAll, plan.Config.Pack)
	return func(step, r int) (proto.BatchMeta, error) {
		m := base
		m.Step, m.DPRank = step, r
		return m, nil
	}
}

// collect waits for every micro-batch of step st and decodes its rows.
func (sw *ShardWorkers) collect(ctx context.Context, epoch int, st balancer.Step) (pipeline.StepBatch, error) {
	mem := memory.NewGoAllocator()
	sb := pipeline.StepBatch{Step: st.Index, Rows: make([][][]proto.Row, len(st.Ranks))}
	for dp, mbs := range st.Ranks {
		sb.Rows[dp] = make([][]proto.Row, len(mbs))
		for mb, entries := range mbs {
			p, err := sw.work.Wait(ctx, Key{Epoch: epoch, Step: st.Index, DP: dp, MicroBatch: mb}, 0)
			if err != nil {
				return sb, err
			}
			rows, err := decodeRows(mem, p)
			if err != nil {
				return sb, fmt.Errorf("serve: result of step %d dp %d mb %d: %w", st.Index, dp, mb, err)
			}
			if len(rows) != len(entries) {
				return sb, fmt.Errorf("serve: result of step %d dp %d mb %d has %d rows, want %d: %w",
					st.Index, dp, mb, len(rows), len(entries), ErrJobMismatch)
			}
			for i, row := range rows {
				if row.Weight == 0 && entries[i].Weight > 0 {
					sw.failed[row.ID] = true
				}
			}
			sb.Rows[dp][mb] = rows
		}
	}
	return sb, nil
}

func decodeRows(mem memory.Allocator, p []byte) ([]proto.Row, error) {
	rec, err := proto.DecodeIPC(mem, p)
	if err != nil {
		return nil, err
	}
	defer rec.Release()
	_, rows, err := proto.ReadRows(rec)
	return rows, err
}

// importQuarantine copies the workers' quarantine records of the samples
// that failed on them into the Prepared's quarantine (its index rejects it
// found itself).
func (sw *ShardWorkers) importQuarantine(ctx context.Context) error {
	for id := range sw.failed {
		e, err := sw.qkv.Get(ctx, QuarantineKey(id, ""))
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				sw.log.Warn("shard: a worker failed a sample without a quarantine record", "id", id)
				continue
			}
			return fmt.Errorf("serve: quarantine record of %q: %w", id, err)
		}
		var r loader.Reject
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return fmt.Errorf("serve: quarantine record of %q: %w", id, err)
		}
		_ = sw.prep.Quarantine.Write(r)
	}
	sw.failed = map[string]bool{}
	return nil
}

// Close drops the run's remaining items, deletes its buckets and closes the
// connection.
func (sw *ShardWorkers) Close() error {
	for _, s := range sw.subs {
		_ = s.Unsubscribe()
	}
	var errs []error
	if sw.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if sw.work != nil {
			errs = append(errs, sw.work.Reset(ctx))
		}
		if err := sw.js.DeleteObjectStore(ctx, Bucket(sw.cfg.Job)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("serve: delete work bucket: %w", err))
		}
		if err := sw.js.DeleteKeyValue(ctx, natsenv.QuarantineBucket(sw.cfg.Job)); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			errs = append(errs, fmt.Errorf("serve: delete quarantine bucket: %w", err))
		}
	}
	if sw.nc != nil {
		sw.nc.Close()
	}
	return errors.Join(errs...)
}
