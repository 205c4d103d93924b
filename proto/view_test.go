package proto

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestViewBatch: a viewer fetch gets the batch's chunks, or the service's
// error reply (outside the plan or another refusal), or the server's "no
// responders" when nothing serves the rank.
func TestViewBatch(t *testing.T) {
	s := startServer(t, 1<<20)
	nc, _ := connect(t, s)
	key := BatchKey{Job: "v", Epoch: 0, Step: 3, MicroBatch: 1, DPRank: 0, MPRank: 0}
	payload := bytes.Repeat([]byte("abc"), 5000)
	cases := []struct {
		name    string
		answer  func(m *nats.Msg)
		wantErr error
	}{
		{"batch", func(m *nats.Msg) { _, _ = SendBatch(nc, m.Reply, key, 0, payload, Checksum(payload), 4096) }, nil},
		{"outside", func(m *nats.Msg) { _ = nc.PublishMsg(ViewError(m.Reply, "past the end", true)) }, ErrOutsidePlan},
		{"refused", func(m *nats.Msg) { _ = nc.PublishMsg(ViewError(m.Reply, "busy", false)) }, ErrView},
		{"no service", nil, ErrNoService},
	}
	subj, _ := ViewSubject("v", 0, 0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.answer != nil {
				sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
					var req FetchRequest
					if err := DecodeControl(m.Data, &req); err != nil || !req.View || req.Key() != key {
						t.Errorf("request %+v (%v), want a viewer fetch of %v", req, err, key)
						return
					}
					c.answer(m)
				})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = sub.Unsubscribe() }()
				_ = nc.Flush()
			}
			got, err := ViewBatch(testCtx(t), nc, key, 1<<20)
			if !errors.Is(err, c.wantErr) || (err != nil) != (c.wantErr != nil) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if c.wantErr == nil && !bytes.Equal(got, payload) {
				t.Errorf("got %d bytes, want the %d sent", len(got), len(payload))
			}
		})
	}
}
