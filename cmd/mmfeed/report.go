package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/mmfeed/mmfeed/pipeline"
)

func init() {
	commands["report"] = command{"plan from cheap features and compare mmfeed with the baselines", runReport}
}

func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	jf := bindJobFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	quarantine := fs.String("quarantine", "", "write quarantined samples to this JSONL file")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := jf.config()
	if err != nil {
		return err
	}
	qw := io.Discard
	if *quarantine != "" {
		f, err := os.Create(*quarantine)
		if err != nil {
			return err
		}
		defer f.Close()
		qw = f
	}
	prep, err := pipeline.Prepare(ctx, cfg, qw)
	if err != nil {
		return err
	}
	defer prep.Close()
	rep, err := prep.Report()
	if err != nil {
		return err
	}
	if *asJSON {
		return rep.WriteJSON(stdout)
	}
	fmt.Fprintf(stdout, "%s: %d samples seen, %d quarantined\n", cfg.Input, prep.Seen(), rep.Quarantined)
	return rep.WriteTable(stdout)
}
