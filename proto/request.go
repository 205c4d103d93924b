package proto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mmfeed/mmfeed/internal/ctxutil"
)

// RegisterAttempt is how long RegisterRank waits for one answer before it
// sends the register again: longer than the service lets a register wait
// for its epoch's plan (serve's RegisterWait, 20 s by default), so a
// register the service is still working on is not sent twice.
const RegisterAttempt = 30 * time.Second

// errReconnected ends a request attempt whose connection reconnected while
// it waited: the old connection may have taken the request or its reply
// along.
var errReconnected = errors.New("proto: the connection reconnected while a request waited")

// RegisterRank sends reg on its rank's register subject (RankControlSubject)
// as a request and returns the service's reply, a refusal too (the caller
// reads OK, Code and Retry). A request or reply in flight when a connection
// drops is lost on core NATS, and a register is idempotent, so it is sent
// again (docs/protocol.md section 6): at once when nc reconnected while it
// waited, after a pause while no service subscribes (no responders: the
// service is starting or reconnecting) or nc is disconnected, and when
// attempt (≤ 0: RegisterAttempt) passed without a reply. ctx bounds the
// whole call.
func RegisterRank(ctx context.Context, nc *nats.Conn, reg Register, attempt time.Duration) (RegisterReply, error) {
	subj, err := RankControlSubject(reg.Job, CtlRegister, reg.DPRank, reg.MPRank)
	if err != nil {
		return RegisterReply{}, err
	}
	data, err := json.Marshal(reg)
	if err != nil {
		return RegisterReply{}, fmt.Errorf("proto: register: %w", err)
	}
	if attempt <= 0 {
		attempt = RegisterAttempt
	}
	m, err := requestAgain(ctx, nc, subj, data, attempt)
	if err != nil {
		return RegisterReply{}, fmt.Errorf("proto: register rank dp=%d mp=%d: %w", reg.DPRank, reg.MPRank, err)
	}
	var rep RegisterReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("proto: register reply: %v: %w", err, ErrControl)
	}
	return rep, nil
}

// requestAgain sends an idempotent request (a register, an ack) on subj and
// returns its reply, sending it again until one comes or ctx ends: at once
// after a reconnect or an unanswered attempt, after a pause (100 ms doubling
// to 2 s) while nobody subscribes to subj or nc is disconnected.
func requestAgain(ctx context.Context, nc *nats.Conn, subj string, data []byte, attempt time.Duration) (*nats.Msg, error) {
	pause := 100 * time.Millisecond
	for {
		m, err := requestOnce(ctx, nc, subj, data, attempt)
		switch {
		case err == nil:
			return m, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errReconnected), errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrReconnectBufExceeded):
			if err := ctxutil.Sleep(ctx, pause); err != nil {
				return nil, err
			}
			pause = min(2*pause, 2*time.Second)
		default:
			return nil, err
		}
	}
}

// requestOnce sends one request and waits up to attempt for its reply; it
// gives up early with errReconnected when nc reconnects meanwhile.
func requestOnce(ctx context.Context, nc *nats.Conn, subj string, data []byte, attempt time.Duration) (*nats.Msg, error) {
	reconnected, stop := watchReconnects(nc) // before the request, so no reconnect after it is missed
	defer stop()
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case _, ok := <-reconnected:
			if ok {
				cancel(errReconnected)
			}
		case <-wctx.Done():
		}
	}()
	actx, stop := context.WithTimeout(wctx, attempt)
	defer stop()
	m, err := nc.RequestWithContext(actx, subj, data)
	if err != nil && errors.Is(context.Cause(wctx), errReconnected) {
		return nil, errReconnected
	}
	return m, err
}

// watchReconnects returns a channel that receives a value each time nc
// reconnects (a request or a reply in flight may have been lost with the
// old connection) and the func that stops the watch and closes the
// channel. Watch before sending what a reconnect may lose, so that no
// reconnect after the send is missed.
func watchReconnects(nc *nats.Conn) (<-chan nats.Status, func()) {
	ch := nc.StatusChanged(nats.CONNECTED)
	return ch, func() { nc.RemoveStatusListener(ch) }
}
