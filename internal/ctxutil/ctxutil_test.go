package ctxutil

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		d    time.Duration
		want error
		// max bounds how long the call may take.
		max time.Duration
	}{
		{"the pause passes", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			10 * time.Millisecond, nil, 5 * time.Second},
		{"zero pause", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			0, nil, 5 * time.Second},
		{"ended before the call", func() (context.Context, context.CancelFunc) { return ended, func() {} },
			time.Hour, context.Canceled, 5 * time.Second},
		{"ended before the call, zero pause", func() (context.Context, context.CancelFunc) { return ended, func() {} },
			0, context.Canceled, 5 * time.Second},
		{"deadline during the pause", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 20*time.Millisecond)
		}, time.Hour, context.DeadlineExceeded, 5 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			t0 := time.Now()
			err := Sleep(ctx, tc.d)
			if took := time.Since(t0); took > tc.max {
				t.Errorf("took %v, want at most %v", took, tc.max)
			}
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if tc.want == nil && time.Since(t0) < tc.d {
				t.Errorf("returned after %v, before the pause of %v", time.Since(t0), tc.d)
			}
		})
	}
}

func TestClosed(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	full := make(chan struct{}, 1)
	full <- struct{}{}
	tests := []struct {
		name string
		ch   chan struct{}
		want bool
	}{
		{"closed", closed, true},
		{"open", make(chan struct{}), false},
		{"nil", nil, false},
		{"holds a value", full, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Closed(tc.ch); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
