package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// TestConfigFileAndEnv checks the precedence: command line > MMFEED_* > --config file > default.
func TestConfigFileAndEnv(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "mmfeed.yaml")
	if err := os.WriteFile(cfg, []byte("dp: 3\nglobal-batch: 48\nimage-field: file_name\nseed: 9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MMFEED_GLOBAL_BATCH", "96")
	t.Setenv("MMFEED_SEED", "11")
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	j := bindJobFlags(fs)
	var stderr bytes.Buffer
	if err := parseFlags(fs, []string{"--config", cfg, "--input", "x.jsonl", "--seed", "5"}, &stderr); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	c := j.cfg
	got := []any{c.Plan.DP, c.Plan.GlobalBatch, c.Loader.ImageColumn, c.Plan.Seed}
	want := []any{3, 96, "file_name", uint64(5)}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("dp, global-batch, image-field, seed: got %v, want %v (file, env, file, flag)", got, want)
			break
		}
	}

	for _, tc := range []struct{ name, file, env, want string }{
		{"unknown key", "no-such-flag: 1\n", "", "no-such-flag"},
		{"bad value", "dp: many\n", "", "dp"},
		{"bad env", "", "x", "MMFEED_DP"},
		{"missing file", "-", "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if tc.file != "-" {
				os.WriteFile(path, []byte(tc.file), 0o644)
			}
			t.Setenv("MMFEED_DP", tc.env)
			fs := flag.NewFlagSet("report", flag.ContinueOnError)
			bindJobFlags(fs)
			var stderr bytes.Buffer
			err := parseFlags(fs, []string{"--config", path}, &stderr)
			if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("got %v, stderr %q; want a usage error naming %q", err, stderr.String(), tc.want)
			}
		})
	}
}

func TestVersionString(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.0", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := versionString(info, true), "mmfeed dev (commit 0123456789ab-dirty, go1.26.0)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := versionString(nil, false), "mmfeed dev (commit unknown, unknown)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	commit = "feedbeef"
	defer func() { commit = "" }()
	if got := versionString(info, true); !strings.Contains(got, "commit feedbeef,") {
		t.Errorf("got %q, want the link-time commit", got)
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", false)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("planned epoch", "epoch", 2)
	log.Debug("hidden")
	if got := buf.String(); !strings.Contains(got, `"msg":"planned epoch","epoch":2`) || strings.Contains(got, "hidden") {
		t.Errorf("json log %q", got)
	}
	if _, err := newLogger(&buf, "xml", false); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Errorf("xml: got %v", err)
	}
}

// TestGroupedHelp checks that every command's help lists each flag once, under
// its group, and ends with examples.
func TestGroupedHelp(t *testing.T) {
	for _, cmd := range []string{"synth", "report", "shard", "serve"} {
		t.Run(cmd, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{cmd, "--help"}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			help := stderr.String()
			fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
			if cmd != "synth" {
				bindJobFlags(fs)
			}
			fs.VisitAll(func(f *flag.Flag) {
				if n := strings.Count(help, "  --"+f.Name+" "); n != 1 {
					t.Errorf("--%s listed %d times", f.Name, n)
				}
			})
			if !strings.Contains(help, "\nExamples:\n  mmfeed "+cmd) {
				t.Errorf("no examples in %s", help)
			}
			if cmd != "synth" && !strings.Contains(help, "\nDataset:\n  --input ") {
				t.Errorf("no Dataset group starting with --input in %s", help)
			}
		})
	}
}

func TestProgressBarSilentWhenNotATerminal(t *testing.T) {
	var buf bytes.Buffer
	if progressBar(&buf, "x", "steps") != nil {
		t.Error("a bar for a buffer")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if progressBar(f, "x", "steps") != nil {
		t.Error("a bar for a regular file")
	}
}

// A mistyped MMFEED_* variable gets a warning naming the flag it resembles;
// flags, the trainer's and the build's variables get none.
func TestWarnUnknownEnv(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Int("global-batch", 0, "")
	fs.Int("dp", 0, "")
	env := []string{"MMFEED_GLOBALBATCH=64", "MMFEED_DP=2", "MMFEED_PYTHON=/x", "MMFEED_SOAK_SECONDS=5", "MMFEED_NOPE=1", "PATH=/bin", "MMFEED_FEATURE_CACHE=/c"}
	var out bytes.Buffer
	warnUnknownEnv(fs, env, &out)
	want := "warning: MMFEED_GLOBALBATCH is not a flag of mmfeed serve; ignored (did you mean MMFEED_GLOBAL_BATCH?)\n" +
		"warning: MMFEED_NOPE is not a flag of mmfeed serve; ignored\n"
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// A wrong flag gets its error and where the help is, not the whole help
// (which scrolled the error away); -h still prints the help.
func TestUnknownFlagIsShort(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"report", "--nope"}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	want := "mmfeed report: flag provided but not defined: -nope\n(mmfeed report -h lists the flags)\n"
	if got := stderr.String(); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// No flag's text has backquotes: the flag package takes a backquoted word
// for the value's name ("--shards mmfeed shard" in inspect's help).
func TestHelpHasNoBackquotedNames(t *testing.T) {
	for _, cmd := range []string{"synth", "report", "shard", "serve", "creds", "inspect"} {
		var stdout, stderr bytes.Buffer
		run(context.Background(), []string{cmd, "--help"}, &stdout, &stderr)
		for _, line := range strings.Split(stderr.String(), "\n") {
			if f, rest, ok := strings.Cut(strings.TrimSpace(line), " "); ok && strings.HasPrefix(f, "--") && strings.Contains(rest, " ") {
				t.Errorf("%s --help: %q names its value with several words", cmd, line)
			}
		}
	}
}
