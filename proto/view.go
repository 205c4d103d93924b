package proto

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// A viewer fetch (FetchRequest.View) that the service cannot answer with the
// batch gets one message with ViewErrorHeader (the reason) and, when the key
// is outside the job's plan (a micro-batch, step or epoch past its end),
// ViewOutsideHeader "1".
const (
	ViewErrorHeader   = "Mmfeed-View-Error"
	ViewOutsideHeader = "Mmfeed-View-Outside"
)

var (
	// ErrOutsidePlan: the viewed key is past the plan's end (a viewer counts
	// a step's micro-batches by asking 0, 1, ... until it gets this).
	ErrOutsidePlan = errors.New("proto: batch outside the job's plan")
	// ErrNoService: nothing answers on the rank's fetch subject (no service
	// on the core data plane runs the job, or the rank does not exist).
	ErrNoService = errors.New("proto: no service answers the rank's fetch subject")
	// ErrView: the service answered a viewer fetch with an error.
	ErrView = errors.New("proto: viewer fetch refused")
)

// ViewSubject returns mmfeed.<job>.view.<dp>.<mp>: where a viewer asks for a
// copy of rank (dp, mp)'s batches (ViewBatch). The service answers only
// viewer fetches there, so a read-only credential that may publish there
// cannot move, rewind or acknowledge the rank (the viewer of
// docs/security.md).
func ViewSubject(job string, dp, mp int) (string, error) { return rankSubject(job, "view", dp, mp) }

// ViewError returns the error reply of a viewer fetch.
func ViewError(subj, reason string, outside bool) *nats.Msg {
	m := nats.NewMsg(subj)
	m.Header.Set(ViewErrorHeader, reason)
	if outside {
		m.Header.Set(ViewOutsideHeader, "1")
	}
	return m
}

// ViewBatch asks the service for a copy of key's payload on the core data
// plane (a FetchRequest with View set, on ViewSubject) and reassembles it. Nothing is taken
// from the rank: the service neither marks the batch sent nor waits for an
// ack. It returns ErrOutsidePlan, ErrNoService, or ErrView with the
// service's reason; ctx bounds the wait.
func ViewBatch(ctx context.Context, nc *nats.Conn, key BatchKey, maxBatchBytes int64) ([]byte, error) {
	subj, err := ViewSubject(key.Job, key.DPRank, key.MPRank)
	if err != nil {
		return nil, err
	}
	req := NewFetchRequest(key)
	req.View = true
	if err := req.Validate(); err != nil {
		return nil, err
	}
	data, err := EncodeControl(req)
	if err != nil {
		return nil, err
	}
	re, err := NewReassembler[struct{}](ReassemblerConfig{MaxBatchBytes: maxBatchBytes, MaxPending: 1, Remember: 1})
	if err != nil {
		return nil, err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("proto: view %v: %w", key, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subj, inbox, data); err != nil {
		return nil, fmt.Errorf("proto: view %v: %w", key, err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("proto: view %v on %s: %w", key, subj, ErrNoService)
		}
		if err != nil {
			return nil, fmt.Errorf("proto: view %v: %w", key, err)
		}
		if m.Header.Get("Status") == "503" {
			return nil, fmt.Errorf("proto: view %v on %s: %w", key, subj, ErrNoService)
		}
		if reason := m.Header.Get(ViewErrorHeader); reason != "" {
			if m.Header.Get(ViewOutsideHeader) == "1" {
				return nil, fmt.Errorf("proto: view %v: %s: %w", key, reason, ErrOutsidePlan)
			}
			return nil, fmt.Errorf("proto: view %v: %s: %w", key, reason, ErrView)
		}
		a, err := re.Add(m.Header, m.Data, struct{}{})
		if err != nil {
			return nil, fmt.Errorf("proto: view %v: %w", key, err)
		}
		if a != nil && a.Payload != nil {
			if a.Header.BatchKey != key {
				return nil, fmt.Errorf("proto: view %v: got %v: %w", key, a.Header.BatchKey, ErrView)
			}
			return a.Payload, nil
		}
	}
}
