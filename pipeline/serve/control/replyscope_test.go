package control

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

func TestCheckReply(t *testing.T) {
	rank0, _ := proto.InboxPrefix("job-1", 0, 0)
	rank1, _ := proto.InboxPrefix("job-1", 1, 0)
	tests := []struct {
		name   string
		reply  string
		strict bool
		own    []string
		want   string
	}{
		{"own rank inbox", rank0 + ".abc.1", true, []string{rank0}, ""},
		{"own rank inbox, no auth", rank0 + ".abc", false, []string{rank0}, ""},
		{"plain inbox, no auth", "_INBOX.Xy12.3", false, []string{rank0}, ""},
		{"plain inbox, job-wide subject", "_INBOX.Xy12.3", true, nil, ""},
		{"plain inbox with auth", "_INBOX.Xy12.3", true, []string{rank0}, natsenv.ReplyNotOwn},
		{"kv config", "$KV.mmfeed_job-1.config", false, []string{rank0}, natsenv.ReplyNotInbox},
		{"kv rank step", "$KV.mmfeed_job-1.rank.1.0.step", true, []string{rank0}, natsenv.ReplyNotInbox},
		{"stream delete", "$JS.API.STREAM.DELETE.OBJ_mmfeed_features", false, nil, natsenv.ReplyNotInbox},
		{"batch subject", "mmfeed.job-1.batch.0.0", false, []string{rank0}, natsenv.ReplyNotInbox},
		{"another rank's inbox", rank1 + ".abc", false, []string{rank0}, natsenv.ReplyForeign},
		{"another rank's inbox, job-wide", rank1 + ".abc", false, nil, natsenv.ReplyForeign},
		{"the worker's inbox", work.WorkerInboxPrefix + ".a", false, []string{rank0}, natsenv.ReplyForeign},
		{"the viewer's inbox from a rank", natsenv.ViewerInboxPrefix + ".a", false, []string{rank0}, natsenv.ReplyForeign},
		{"the viewer's own", natsenv.ViewerInboxPrefix + ".a", true, []string{natsenv.ViewerInboxPrefix}, ""},
		{"the service's inbox", natsenv.ServiceInboxPrefix + ".a.1", false, []string{rank0}, natsenv.ReplyService},
		{"the service's inbox, job-wide", natsenv.ServiceInboxPrefix + ".a.1", false, nil, natsenv.ReplyService},
		{"a local worker's result", natsenv.ServiceInboxPrefix + ".a.1", true, workerInboxes, ""},
		{"the prefix itself", rank0, true, []string{rank0}, natsenv.ReplyForeign},
		{"a longer token that starts like the prefix", rank0 + "9.x", true, []string{rank0}, natsenv.ReplyForeign},
		{"wildcard", "_INBOX.>", false, nil, natsenv.ReplyNotInbox},
		{"token wildcard", "_INBOX.*.x", false, nil, natsenv.ReplyNotInbox},
		{"empty token", "_INBOX..x", false, nil, natsenv.ReplyNotInbox},
		{"bare _INBOX", "_INBOX", false, nil, natsenv.ReplyNotInbox},
		{"whitespace", "_INBOX.a b", false, nil, natsenv.ReplyNotInbox},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := natsenv.CheckReply(tt.reply, tt.strict, tt.own...); got != tt.want {
				t.Errorf("CheckReply(%q, strict=%v, %q) = %q, want %q", tt.reply, tt.strict, tt.own, got, tt.want)
			}
		})
	}
}

// TestReplyOwner: whose inbox a control message may be answered on.
func TestReplyOwner(t *testing.T) {
	g := NewGuard("job-1", 2, 1, nil, nil)
	tests := []struct {
		subj, data string
		want       string
	}{
		{"mmfeed.job-1.ctl.register.1.0", `{}`, "_INBOX.mmfeed.job-1.1.0"},
		{"mmfeed.job-1.ctl.register", `{"dp_rank":1,"mp_rank":0}`, "_INBOX.mmfeed.job-1.1.0"},
		{"mmfeed.job-1.ctl.register.2.0", `{}`, "_INBOX.mmfeed.job-1"},                     // no such rank
		{"mmfeed.job-1.ctl.register", `{"job":"job-1","extra":1}`, "_INBOX.mmfeed.job-1"},  // names no rank
		{"mmfeed.job-1.ctl.register", `{"dp_rank":-1,"mp_rank":0}`, "_INBOX.mmfeed.job-1"}, // outside the layout
		{"mmfeed.job-1.ctl.register", `not json`, "_INBOX.mmfeed.job-1"},
	}
	for _, tt := range tests {
		if got := g.ownOf(tt.subj, []byte(tt.data)); len(got) != 1 || got[0] != tt.want {
			t.Errorf("ownOf(%s, %s) = %q, want [%q]", tt.subj, tt.data, got, tt.want)
		}
	}
}

// TestWorkReplyOK: a work result is taken and answered on a worker's inbox
// or the service's own (its local workers), never on a $KV subject or a
// trainer's inbox; a refusal is counted, and the planner's handlers drop
// such a result unread.
func TestWorkReplyOK(t *testing.T) {
	srv := testnats.Server(t, testnats.Options{})
	nc, _ := testnats.Connect(t, srv.ClientURL())
	log := slog.New(slog.DiscardHandler)
	met := newFakeMetrics()
	g := NewGuard("job-1", 1, 1, met, NewRateLog(log))
	g.SetStrict(true)
	ok := g.WorkReplyOK("result")
	sub, err := nc.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		reply string
		want  bool
	}{
		{work.WorkerInboxPrefix + ".a.1", true},
		{natsenv.ServiceInboxPrefix + ".a.1", true},
		{"$KV.mmfeed_job-1.config", false},
		{"_INBOX.mmfeed.job-1.0.0.x", false},
		{"_INBOX.other.1", false},
	} {
		m := &nats.Msg{Subject: "mmfeedwork.job-1.result", Reply: tc.reply, Sub: sub}
		if got := ok(m); got != tc.want {
			t.Errorf("reply %q: answered %v, want %v", tc.reply, got, tc.want)
		}
	}
	w, err := work.NewPlanner("job-1", 1, 4, nil, nc, "cfg", log)
	if err != nil {
		t.Fatal(err)
	}
	w.GuardReplies(ok)
	subs, err := w.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	for _, subj := range []string{work.FeaturesSubject("job-1"), work.ResultSubject("job-1")} {
		// a feature result would be answered "ok" on the config key
		forged := &nats.Msg{Subject: subj, Reply: "$KV.mmfeed_job-1.config", Data: []byte("[]"),
			Header: nats.Header{work.HdrItem: []string{"f1"}}}
		if err := nc.PublishMsg(forged); err != nil {
			t.Fatal(err)
		}
	}
	testnats.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := met.refusedReplies("result"); n != 5 {
			return fmt.Errorf("%v work replies refused, want 5 (3 checked, 2 forged results)", n)
		}
		return nil
	})
}
