package deliver

// lastStored returns the step after the last batch stored for a rank, or
// that batch's step when its micro-batch is not the step's last.
func (s *Service) lastStored(ctx context.Context, dp, mp int) (proto.Pos, bool, error) {
	subj, _ := proto.BatchSubject(s.cfg.Job, dp, mp)
	m, err := s.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return proto.Pos{}, false, nil
	}
	if err != nil {
		return proto.Pos{}, false, fmt.Errorf("serve: last message of %s: %w", subj, err)
	}
	h, err := proto.ParseChunkHeader(m.Header)
	if err != nil {
		return proto.Pos{}, false, nil // not ours to interpret: republish from the trainer's position
	}
	if h.MicroBatch == s.cfg.Pipeline.Plan.MicroBatches-1 && h.Index == h.Count-1 {
		return s.epochs.Norm(proto.Pos{Epoch: h.Epoch, Step: h.Step + 1}), true, nil
	}
	return proto.Pos{Epoch: h.Epoch, Step: h.Step}, true, nil
}

// firstStored returns the first stored batch position of a rank, and whether
// it is whole (its chunk 0 is still there).
func (s *Service) firstStored(ctx context.Context, dp, mp int) (h proto.ChunkHeader, ok bool, err error) {
	subj, _ := proto.BatchSubject(s.cfg.Job, dp, mp)
	m, err := s.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("serve: first message of %s: %w", subj, err)
	}
	h, err = proto.ParseChunkHeader(m.Header)
	return h, err == nil, nil
}

// streamSnapshot is the JetStream data plane's stream state, polled.
type streamSnapshot struct {
	bytes, msgs uint64
	ranks       []consumerSnapshot
}

type consumerSnapshot struct {
	ok                  bool
	pending, ackPending uint64
}

// streamPoll is how often pollStream reads the stream and consumer state.
var streamPoll = 2 * time.Second // a variable so tests can lengthen it

// pollStream keeps s.streamSnap current until ctx ends (JetStream data plane
// only), so that a Prometheus scrape makes no JetStream request.
func (s *Service) pollStream(ctx context.Context) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, streamPoll)
		snap := &streamSnapshot{ranks: make([]consumerSnapshot, s.cfg.ranks())}
		if info, err := s.stream.Info(rctx); err == nil {
			snap.bytes, snap.msgs = info.State.Bytes, info.State.Msgs
			for r := range snap.ranks {
				cons, err := s.stream.Consumer(rctx, proto.ConsumerName(s.cfg.Job, r/s.cfg.MP, r%s.cfg.MP))
				if err != nil {
					continue
				}
				if ci, err := cons.Info(rctx); err == nil {
					snap.ranks[r] = consumerSnapshot{ok: true, pending: ci.NumPending, ackPending: uint64(ci.NumAckPending)}
				}
			}
			s.streamSnap.Store(snap)
		}
		cancel()
		t := time.NewTimer(streamPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}
// checkStreamAssets recreates the JetStream data plane's stream and
// consumers when they are missing.
func (s *Service) checkStreamAssets(ctx context.Context) error {
	c := s.cfg
	if _, err := s.js.Stream(ctx, proto.StreamName(c.Job)); errors.Is(err, jetstream.ErrStreamNotFound) {
		return s.recreate("stream "+proto.StreamName(c.Job), func() error { return s.recreateStream(ctx) })
	} else if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	for r := range c.ranks() {
		name := proto.ConsumerName(c.Job, r/c.MP, r%c.MP)
		if _, err := s.stream.Consumer(ctx, name); errors.Is(err, jetstream.ErrConsumerNotFound) {
			if err := s.recreate("consumer "+name, func() error { return s.ensureConsumer(ctx, r) }); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("consumer %s: %w", name, err)
		}
	}
	return nil
}

func (s *Service) ensureConsumer(ctx context.Context, r int) error {
	if _, err := s.cfg.assets().EnsureConsumer(ctx, s.js, r/s.cfg.MP, r%s.cfg.MP); err != nil {
		return fmt.Errorf("recreate consumer: %w", err)
	}
	return nil
}

// recreateStream recreates the stream and the consumers, then rewinds every
// rank to its first unacknowledged step: the batches the lost stream held
// are published again (a new generation), so none is lost.
func (s *Service) recreateStream(ctx context.Context) error {
	c := s.cfg
	if _, err := c.assets().EnsureStream(ctx, s.js); err != nil {
		return fmt.Errorf("recreate stream: %w", err)
	}
	for r := range c.ranks() {
		if err := s.ensureConsumer(ctx, r); err != nil {
			return err
		}
	}
	for r := range c.ranks() {
		to := s.ranks.Next(r)
		if err := s.requestRewind(ctx, deliver.Rewind{Rank: r, To: to, Reason: "stream recreated"}); err != nil {
			return err
		}
	}
	return nil
}
// publish sends one payload, retrying transient failures (a lost connection)
// with the same message ids until ctx ends; stream-full backpressure is
// retried inside proto.Publisher.
func (s *Service) publish(ctx context.Context, key proto.BatchKey, gen int, payload []byte) error {
	backoff := 100 * time.Millisecond
	s.health.publishing(true)
	defer s.health.publishing(false)
	start := time.Now()
	for n := 1; ; n++ {
		st, err := s.pub.Publish(ctx, key, gen, payload)
		s.met.retries.Add(float64(st.Retries))
		if err == nil {
			s.met.chunks.Add(float64(st.Chunks))
			s.met.nChunks.Add(int64(st.Chunks))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if permanent(err) {
			return fmt.Errorf("serve: %w", err)
		}
		s.met.retries.Inc()
		escalate(s.log.With("batch", key.String()), "publish failed, retrying", n, time.Since(start), s.cfg.StuckAfter, err)
		if s.cfg.GiveUpAfter > 0 && time.Since(start) > s.cfg.GiveUpAfter {
			return fmt.Errorf("serve: publish %s failing for %s: %w", key, time.Since(start).Round(time.Second), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func permanent(err error) bool {
	for _, e := range []error{proto.ErrTooLarge, proto.ErrInvalidConfig, proto.ErrInvalidMeta, proto.ErrInvalidRow, proto.ErrInvalidName, proto.ErrSchema} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
