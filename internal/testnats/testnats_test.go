package testnats

import (
	"errors"
	"testing"
	"time"
)

func TestServerConnectPublish(t *testing.T) {
	s := Server(t, Options{MaxPayload: 2 << 20})
	nc, js := Connect(t, s.ClientURL())
	if got := nc.MaxPayload(); got != 2<<20 {
		t.Errorf("max payload %d, want %d", got, 2<<20)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	PublishJSON(t, nc, "x", map[string]int{"a": 1})
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != `{"a":1}` {
		t.Fatalf("got %v, %v", m, err)
	}
	n := 0
	CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
}
