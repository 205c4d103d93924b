package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A command's help lists --nats (the URL) first in its NATS group, before the
// --nats-* flags that qualify it (inspect listed it after --nats-user).
func TestHelpListsTheNATSURLFirst(t *testing.T) {
	for _, cmd := range []string{"inspect", "serve", "shard"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{cmd, "--help"}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		help := stderr.String()
		group := help[strings.Index(help, "\nNATS:\n"):]
		if !strings.HasPrefix(group, "\nNATS:\n  --nats string") {
			t.Errorf("%s --help: NATS group starts %q, want --nats first", cmd, group[:min(len(group), 60)])
		}
	}
}
