package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// otherEnv are the MMFEED_* variables that are not flags: read by the trainer,
// the build, the tests and the benchmarks, never by a command's flags.
var otherEnv = map[string]bool{
	"PYTHON": true, "TOKENIZER_DIR": true, "TOKENIZER": true, "FEATURE_CACHE": true, "NATS_PASSWORD": true,
	"NATS_TOKEN": true, "HTTP_TOKEN": true, "BIN": true, "NATS_SERVER": true, "CORPUS": true, "CORPUS_LIMIT": true,
	"REQUIRE_PEERS": true, "REQUIRE_BROWSER": true, "CHROMIUM": true, "TEST_LOG": true, "CLUSTER_LONG": true,
	"ELASTIC_LONG": true, "FAULT": true, "ARTIFACTS": true, "PEAK_TFLOPS": true, "WORK": true, "PARITY_REPORT": true,
	"REAL_ITEMS": true,
}

// otherEnvPrefixes are families of such variables (MMFEED_SOAK_SECONDS, ...).
var otherEnvPrefixes = []string{"SOAK_", "E2E_", "BENCH_", "PLAN_"}

// warnUnknownEnv writes one line for each MMFEED_* variable in env that names
// no flag of fs and no variable mmfeed reads elsewhere: a mistyped
// MMFEED_GLOBALBATCH would otherwise be ignored without a word.
func warnUnknownEnv(fs *flag.FlagSet, env []string, w io.Writer) {
	var lines []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, "MMFEED_")
		if !ok || otherEnv[rest] || hasAnyPrefix(rest, otherEnvPrefixes) {
			continue
		}
		flagName := strings.ReplaceAll(strings.ToLower(rest), "_", "-")
		if fs.Lookup(flagName) != nil {
			continue
		}
		line := fmt.Sprintf("warning: %s is not a flag of mmfeed %s; ignored", name, fs.Name())
		if near := nearFlag(fs, flagName); near != "" {
			line += fmt.Sprintf(" (did you mean MMFEED_%s?)", strings.ToUpper(strings.ReplaceAll(near, "-", "_")))
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// nearFlag returns the flag of fs that name spells without its dashes or
// with them moved ("globalbatch", "global-batch"), or "".
func nearFlag(fs *flag.FlagSet, name string) string {
	squash := func(s string) string { return strings.ReplaceAll(s, "-", "") }
	found := ""
	fs.VisitAll(func(f *flag.Flag) {
		if found == "" && squash(f.Name) == squash(name) {
			found = f.Name
		}
	})
	return found
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
