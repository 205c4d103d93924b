package serve

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/control"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRefusalFloodLogsLittle: 5,000 forged control messages (bad payloads,
// and requests with a reply outside the requester's inbox) are all counted
// on /metrics, and write a few log lines, not one each.
func TestRefusalFloodLogsLittle(t *testing.T) {
	cfg := testConfig(t, corpus(t, 20), 1, 1, "colocated")
	var buf lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	r := start(t, cfg)
	nc, err := nats.Connect(r.s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fb, _ := proto.RankControlSubject(cfg.Job, proto.CtlFeedback, 0, 0)
	reg, _ := proto.RankControlSubject(cfg.Job, proto.CtlRegister, 0, 0)
	const flood = 2500
	t0 := time.Now()
	for range flood {
		if err := nc.Publish(fb, []byte(`{"job":"job-1","dp_rank":1,"mp_rank":0}`)); err != nil { // names another rank
			t.Fatal(err)
		}
		if err := nc.PublishRequest(reg, "$KV.mmfeed_job-1.config", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		bad := testutil.ToFloat64(r.s.met.control.WithLabelValues(proto.CtlFeedback, "refused"))
		replies := testutil.ToFloat64(r.s.met.repliesRefused.WithLabelValues(proto.CtlRegister, natsenv.ReplyNotInbox))
		if bad != flood || replies != flood {
			return errorf("%v feedbacks and %v replies refused, want %d each", bad, replies, flood)
		}
		return nil
	})
	secs := int(time.Since(t0)/control.RateLogEvery) + 1
	for _, line := range []string{"bad control message", "reply subject is outside"} {
		if n := strings.Count(buf.String(), line); n < 1 || n > secs+1 {
			t.Errorf("%d %q lines for %d refusals in %ds, want 1 to %d", n, line, flood, secs, secs+1)
		}
	}
}
