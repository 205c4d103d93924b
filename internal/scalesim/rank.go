package scalesim

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// replayWindow: after a reconnect a rank sends again the acks and dones it
// sent within this long (the Python client's REPLAY_S).
const replayWindow = 30 * time.Second

// sentMsg is one ack or done kept for the replay after a reconnect.
type sentMsg struct {
	at   time.Time
	subj string
	data []byte
}

// rank is one simulated trainer rank (dp, mp 0).
type rank struct {
	dp  int
	sim *sim
	nc  *nats.Conn

	// Written by the rank's goroutine only; read after Run's wait.
	registered time.Duration // the first register's latency
	again      time.Duration // the register for epoch 1's latency (every rank at once, the plan ready)
	recv       []received    // every batch, when Next returned it
	acks       int
	feedbacks  int
	dones      int
	registers  int

	mu     sync.Mutex // recent, replayed from the connection's callback
	recent []sentMsg
}

// received is one batch a rank's Next returned.
type received struct {
	at          time.Time
	epoch, step int
}

func (r *rank) connect(ctx context.Context) error {
	cfg := r.sim.cfg
	opts := []nats.Option{
		nats.Name("scalesim-" + strconv.Itoa(r.dp)),
		nats.CustomInboxPrefix(fmt.Sprintf("_INBOX.mmfeed.%s.%d.0", cfg.Job, r.dp)),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, 0),
		nats.ReconnectHandler(func(*nats.Conn) { r.replay() }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if r.nc, err = nats.Connect(strings.Join(cfg.URLs, ","), opts...); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("scalesim: rank %d connect: %w", r.dp, err)
}

// register registers the rank for epoch and returns the reply; ok is false
// past the job's last epoch.
func (r *rank) register(ctx context.Context, epoch int) (proto.RegisterReply, bool, error) {
	cfg := r.sim.cfg
	reg := proto.Register{Job: cfg.Job, DPRank: r.dp, DP: cfg.DP, MP: 1, Placement: proto.PlacementColocated, Epoch: epoch}
	for {
		r.registers++
		rep, err := proto.RegisterRank(ctx, r.nc, reg, 0)
		switch {
		case err != nil:
			return rep, false, err
		case rep.OK:
			return rep, true, nil
		case rep.Code == proto.RefusedEnd:
			return rep, false, nil
		case !rep.Retry:
			return rep, false, fmt.Errorf("scalesim: rank %d register refused: %s", r.dp, rep.Error)
		}
		select { // the epoch is still being planned, or the service is busy
		case <-ctx.Done():
			return rep, false, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// run is the rank's life: register, then every epoch's steps, then the end.
func (r *rank) run(ctx context.Context) error {
	t0 := time.Now()
	rep, ok, err := r.register(ctx, 0)
	if err != nil || !ok {
		return fmt.Errorf("scalesim: rank %d first register (ok %v): %w", r.dp, ok, err)
	}
	r.registered = time.Since(t0)
	fc := proto.DefaultFetcherConfig(r.sim.cfg.Job, r.dp, 0)
	f, err := proto.NewFetcher(r.nc, nil, fc)
	if err != nil {
		return err
	}
	defer f.Close()
	f.AddEpoch(0, rep.Steps, rep.MicroBatches)
	f.Start(0, 0)
	for epoch := 0; ; epoch++ {
		if epoch > 0 {
			if e := r.sim.cfg.Epochs; e > 0 && epoch >= e {
				return nil // the trainer's own epoch count: no register past it
			}
			t1 := time.Now()
			rep, ok, err = r.register(ctx, epoch)
			if epoch == 1 {
				r.again = time.Since(t1)
			}
			if err != nil {
				return err
			} else if !ok {
				return nil
			}
			f.AddEpoch(epoch, rep.Steps, rep.MicroBatches)
		}
		for step := range rep.Steps {
			if err := r.step(ctx, f, epoch, step, rep); err != nil {
				return err
			}
		}
	}
}

// step takes one step's micro-batches, meets the other ranks, then acks and
// reports as the Python client does.
func (r *rank) step(ctx context.Context, f *proto.Fetcher, epoch, step int, rep proto.RegisterReply) error {
	job := r.sim.cfg.Job
	real := 0
	for mb := range rep.MicroBatches {
		b, err := f.Next(ctx)
		if err != nil {
			return fmt.Errorf("scalesim: rank %d: %w", r.dp, err)
		}
		k := b.Header.BatchKey
		r.recv = append(r.recv, received{time.Now(), k.Epoch, k.Step})
		_, rows, err := proto.ReadRows(b.Record)
		b.Release()
		if err != nil {
			return fmt.Errorf("scalesim: rank %d batch %v: %w", r.dp, k, err)
		}
		if k.Epoch != epoch || k.Step != step || k.MicroBatch != mb {
			return fmt.Errorf("scalesim: rank %d got %v, wants epoch %d step %d micro-batch %d", r.dp, k, epoch, step, mb)
		}
		real += r.sim.deliver(epoch, rows)
	}
	if r.sim.cfg.StepTime > 0 {
		time.Sleep(r.sim.cfg.StepTime)
	}
	if err := r.sim.meet(ctx, epoch, step); err != nil {
		return err
	}
	// One ack a step, of its last micro-batch: an ack means "every batch up
	// to this one is applied" (docs/protocol.md section 11), as the Python
	// client sends it.
	ackSubj, _ := proto.AckSubject(job, r.dp, 0)
	last := proto.BatchKey{Job: job, Epoch: epoch, Step: step, MicroBatch: rep.MicroBatches - 1, DPRank: r.dp}
	if err := r.publish(ackSubj, proto.AckRequest(proto.NewFetchRequest(last)), true); err != nil {
		return err
	}
	r.acks++
	subj, _ := proto.RankControlSubject(job, proto.CtlFeedback, r.dp, 0)
	fb := proto.Feedback{Job: job, Epoch: epoch, Step: step, DPRank: r.dp, ComputeSeconds: 0.01, Samples: real}
	if err := r.publish(subj, fb, false); err != nil {
		return err
	}
	r.feedbacks++
	if step == rep.Steps-1 {
		subj, _ := proto.RankControlSubject(job, proto.CtlDone, r.dp, 0)
		if err := r.publish(subj, proto.Done{Job: job, Epoch: epoch, DPRank: r.dp, Steps: rep.Steps}, true); err != nil {
			return err
		}
		r.dones++
	}
	return nil
}

// publish sends v as JSON on subj; keep marks an ack or done that a
// reconnect sends again.
func (r *rank) publish(subj string, v any, keep bool) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if keep {
		now := time.Now()
		r.mu.Lock()
		r.recent = append(r.recent, sentMsg{now, subj, data})
		i := 0
		for i < len(r.recent) && now.Sub(r.recent[i].at) > replayWindow {
			i++
		}
		r.recent = r.recent[i:]
		r.mu.Unlock()
	}
	if err := r.nc.Publish(subj, data); err != nil {
		return fmt.Errorf("scalesim: rank %d publish %s: %w", r.dp, subj, err)
	}
	return nil
}

// replay sends the recent acks and dones again (after a reconnect: the old
// connection may have lost them, and they are idempotent).
func (r *rank) replay() {
	r.mu.Lock()
	msgs := append([]sentMsg(nil), r.recent...)
	r.mu.Unlock()
	for _, m := range msgs {
		_ = r.nc.Publish(m.subj, m.data)
	}
}
