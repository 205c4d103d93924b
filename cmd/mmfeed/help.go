package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// flagGroups orders the help of every command: a flag is listed under the
// first group whose names or prefixes hold it; the rest under "Command".
var flagGroups = []struct {
	title string
	names []string // exact names, or prefixes ending in "-"
}{
	{"Dataset", []string{"input", "mixture", "root", "allow-absolute-paths", "image-field", "text-field", "id-field", "wds-", "keep", "quarantine"}},
	{"Plan", []string{"dp", "mp", "pp", "micro-batches", "global-batch", "global-tokens", "mb-", "lookahead", "placement", "sync", "strategy", "tail", "seed", "epoch", "epochs", "simulate-ranks"}},
	{"Model and cost model", []string{"model", "patch-size", "cost-scale", "recalibrate"}},
	{"Tokenizer and images", []string{"tokenizer", "max-length", "resize", "image-size", "min-pixels", "max-pixels", "dtype", "norm", "max-image-pixels", "augment", "augment-seed", "workers"}},
	{"NATS", []string{"nats", "nats-", "insecure", "tls-", "asset-check", "stuck-after", "give-up-after", "data-dir", "stream-", "replicas", "max-ack-pending", "ack-wait"}},
	{"Output, logging and config", []string{"out", "json", "http", "http-token", "no-wait", "v", "log-format", "progress-every", "config"}},
}

// examples are printed under each command's flags.
var examples = map[string][]string{
	"synth":  {"mmfeed synth --out /tmp/corpus --samples 2000 --seed 7"},
	"report": {"mmfeed report --input /tmp/corpus/manifest.jsonl --dp 8 --global-batch 128", "mmfeed report --input export.parquet --image-field image.bytes --text-field caption --dp 4 --json", "mmfeed report --mixture mix.yaml --dp 8 --global-batch 256   # weighted sources, docs/mixtures.md"},
	"shard": {"mmfeed shard --input captions.jsonl --root train2017 --image-field file_name --dp 2 --global-batch 32 --out /tmp/shards",
		"mmfeed shard --input /shared/manifest.jsonl --dp 8 --global-batch 128 --out s3://bucket/shards --nats nats://n0:4222   # workers: serve --role worker"},
	"creds": {"mmfeed creds --job demo --dp 2 --mp 2 --out /etc/mmfeed/demo --tls-hosts feeder.internal"},
	"serve": {"mmfeed serve --input /tmp/corpus/manifest.jsonl --dp 2 --mp 2 --placement modality --global-batch 64 --job demo",
		"MMFEED_GLOBAL_BATCH=64 mmfeed serve --config mmfeed.yaml --job demo --log-format json",
		"mmfeed serve --role planner --input /data/manifest.jsonl --dp 8 --global-batch 128 --job big --nats nats://n0:4222",
		"mmfeed serve --role worker --nats nats://n0:4222   # any number, on any machine"},
}

// groupOf returns the flag's group and its rank there (the index of the
// name or prefix that matched, so a group lists its flags in its own order).
func groupOf(name string) (string, int) {
	for _, g := range flagGroups {
		for i, n := range g.names {
			if n == name || (strings.HasSuffix(n, "-") && strings.HasPrefix(name, n)) {
				return g.title, i
			}
		}
	}
	return "Command", 0
}

// groupedUsage prints fs's flags by group, then the command's examples.
func groupedUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, "usage: mmfeed %s [flags]\n", fs.Name())
	byGroup := map[string][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { // alphabetical, then stable by rank in the group
		g, _ := groupOf(f.Name)
		byGroup[g] = append(byGroup[g], f)
	})
	for _, fl := range byGroup {
		slices.SortStableFunc(fl, func(a, b *flag.Flag) int {
			_, ra := groupOf(a.Name)
			_, rb := groupOf(b.Name)
			return ra - rb
		})
	}
	titles := []string{"Command"}
	for _, g := range flagGroups {
		titles = append(titles, g.title)
	}
	for _, title := range titles {
		if len(byGroup[title]) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		for _, f := range byGroup[title] {
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  --%s %s\n    \t%s", f.Name, name, usage)
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		}
	}
	if ex := examples[fs.Name()]; len(ex) > 0 {
		fmt.Fprintln(w, "\nExamples:")
		for _, e := range ex {
			fmt.Fprintln(w, "  "+e)
		}
	}
	fmt.Fprintln(w, "\nEvery flag can also be set as MMFEED_<FLAG> (--global-batch: MMFEED_GLOBAL_BATCH) or in --config FILE.yaml;\nan MMFEED_* variable that names no flag is reported.")
}
