package serve

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// serveGoroutines returns the stacks of the goroutines running code of this
// package (its tests' own goroutines excepted), by goroutine header.
func serveGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		id, _, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " ")
		if strings.Contains(g, "mmfeed/pipeline/serve.") && !strings.Contains(g, "testing.tRunner") &&
			!strings.Contains(g, "serve.startService") {
			out[id] = g
		}
	}
	return out
}

// TestRunLeavesNoGoroutines stops a service mid-job while messages it
// handles on goroutines of their own are in flight (a done that waits for
// acknowledgements that never come, a resend) and the next epoch is being
// published: once Run returns, none of the service's goroutines is left.
func TestRunLeavesNoGoroutines(t *testing.T) {
	t.Cleanup(control.SetDoneAckWait(time.Minute)) // far longer than the test waits below
	before := serveGoroutines()
	cfg := testConfig(t, corpus(t, 120), 2, 1, "colocated")
	cfg.Epochs, cfg.Recalibrate = 2, -1
	cfg.StreamMaxBytes = 256 << 10
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runTrainersConn(t, ctx, cfg, r.s.ClientURL(), []int{0}, false)
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		kind string
		v    any
	}{
		{proto.CtlDone, proto.Done{Job: cfg.Job, Epoch: 1, DPRank: 0, Steps: 99}},
		{proto.CtlResend, proto.Resend{Job: cfg.Job, Epoch: 1, Step: 0, DPRank: 1, Reason: "test"}},
	} {
		b, err := proto.EncodeControl(m.v)
		if err != nil {
			t.Fatal(err)
		}
		subj, _ := proto.ControlSubject(cfg.Job, m.kind)
		if err := nc.Publish(subj, b); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		for _, g := range serveGoroutines() {
			if strings.Contains(g, "advanceAcked") {
				return nil
			}
		}
		return errorf("the done is not being handled")
	})
	nc.Close()
	if err := r.stop(t); err != nil {
		t.Fatalf("service: %v", err)
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		var left []string
		for id, g := range serveGoroutines() {
			if _, ok := before[id]; !ok {
				left = append(left, g)
			}
		}
		if len(left) > 0 {
			return errorf("%d goroutines left after Run returned:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// TestScrapeMakesNoJetStreamRequest scrapes /metrics on the JetStream data
// plane and counts the JetStream API requests the embedded server receives
// between two marker requests around the scrape: the per-rank gauges come
// from the stream state the data plane polls, not from requests per scrape.
func TestScrapeMakesNoJetStreamRequest(t *testing.T) {
	old := streamPoll
	streamPoll = time.Hour // one poll at start, none during the scrape
	t.Cleanup(func() { streamPoll = old })
	cfg := testConfig(t, corpus(t, 60), 2, 1, "colocated")
	cfg.DataPlane = proto.DataPlaneJetStream
	cfg.Recalibrate, cfg.AssetCheck = -1, 0
	r := start(t, cfg)
	checkFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		if r.s.plane.Gauges().Stream == nil || !r.s.publisher.Finished() {
			return errorf("still publishing")
		}
		return nil
	})
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const marker = "$JS.API.INFO"
	var requests, markers atomic.Int64
	var between atomic.Int64 // requests after the first marker and before the second
	sub, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		if m.Subject == marker {
			markers.Add(1)
			return
		}
		requests.Add(1)
		if markers.Load() == 1 {
			between.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mark := func(n int64) {
		if _, err := nc.Request(marker, nil, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, time.Millisecond, func() error {
			if markers.Load() < n {
				return errorf("marker %d not seen", n)
			}
			return nil
		})
	}
	mark(1)
	var body []byte
	for range 3 {
		resp, err := http.Get("http://" + r.s.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	mark(2)
	if !bytes.Contains(body, []byte(`mmfeed_serve_rank_pending_chunks{dp="1",mp="0"}`)) {
		t.Fatalf("scrape has no per-rank stream gauges:\n%s", body)
	}
	if n := between.Load(); n != 0 {
		t.Errorf("3 scrapes made %d JetStream API requests, want 0", n)
	}
	// The counting sees requests: a stream info from the service is one.
	if _, err := r.s.js.Stream(context.Background(), proto.StreamName(cfg.Job)); err != nil { // a stream info
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if requests.Load() == 0 {
			return errorf("no JetStream API request seen")
		}
		return nil
	})
}
