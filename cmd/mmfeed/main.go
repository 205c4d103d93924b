// Command mmfeed is the one binary of mmfeed: a multimodal data service that feeds
// cost-balanced image–text batches to data-parallel trainers.
//
//	mmfeed synth   --out DIR --samples N --seed S [--format jsonl|wds]   generate a skewed corpus
//	mmfeed report  --input PATH --dp N --global-batch B [--json]         plan from cheap features, compare strategies
//	mmfeed shard   --input PATH --dp N --global-batch B --out DIR        preprocess and write per-rank Arrow files
//	mmfeed serve   --input PATH --dp N --global-batch B --job NAME       stream batches over NATS
//	mmfeed serve   --role worker --nats URL                              preprocess work items of a planner
//	mmfeed creds   --job NAME --dp N [--mp M] --out DIR                  per-rank NATS credentials, a TLS CA
//	mmfeed inspect --shards DIR --rank R --step S --out sheet.png        contact sheet of what a rank received
//	mmfeed version
//
// Each command parses its flags into a Config, validates it, runs, and exits; the logic
// lives in the packages. SIGINT and SIGTERM cancel the run cleanly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffyaml"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"version": {"print the version and commit", func(_ context.Context, _ []string, stdout, _ io.Writer) error {
		fmt.Fprintln(stdout, versionString(debug.ReadBuildInfo()))
		return nil
	}},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "mmfeed: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "mmfeed %s: %v\n", args[0], err)
		return 1
	}
}

// errUsage marks an error already explained to the user by the flag package.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: mmfeed <command> [flags]   (mmfeed <command> -h for its flags)")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

// parseFlags parses args into fs, reporting errors on stderr the flag package's way.
// Every command also reads MMFEED_<FLAG> environment variables (--global-batch:
// MMFEED_GLOBAL_BATCH) and a YAML file named by --config (flag names as keys);
// the command line wins over the environment, which wins over the file.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if fs.Lookup("config") == nil {
		fs.String("config", "", "YAML file of flag values (global-batch: 64); flags and MMFEED_* variables win over it")
	}
	// The whole help only for -h: after a wrong flag it would scroll the
	// error away, so the flag package's own output is silenced and the error
	// printed here, with where the help is.
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := ff.Parse(fs, args, ff.WithEnvVarPrefix("MMFEED"), ff.WithConfigFileFlag("config"),
		ff.WithConfigFileParser(ffyaml.Parser))
	fs.SetOutput(stderr)
	fs.Usage = func() { groupedUsage(fs, fs.Output()) }
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return err
		}
		msg := strings.TrimPrefix(err.Error(), "error parsing commandline arguments: ")
		fmt.Fprintf(stderr, "mmfeed %s: %s\n(mmfeed %s -h lists the flags)\n", fs.Name(), msg, fs.Name())
		return errUsage
	}
	warnUnknownEnv(fs, os.Environ(), stderr)
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mmfeed %s: unexpected arguments: %v\n(mmfeed %s -h lists the flags)\n", fs.Name(), fs.Args(), fs.Name())
		return errUsage
	}
	return nil
}
