package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A worker needs --nats; a planner that no worker could reach is refused.
func TestServeRoleUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--role", "worker"}, "--role worker needs --nats URL"},
		{[]string{"serve", "--role", "boss", "--input", "x.jsonl", "--job", "j"}, `role "boss"`},
		{[]string{"serve", "--role", "planner", "--input", "x.jsonl", "--job", "j", "--nats-listen", ""}, "no worker can reach"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error with %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
