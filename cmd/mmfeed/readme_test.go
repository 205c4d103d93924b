package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	natsserver "github.com/nats-io/nats-server/v2/server"
)

// The README's example outputs come from this test: each fenced block after a
// `<!-- golden: NAME -->` marker is run, command by command ("$ " lines; a line
// ending in "\" or an open single quote continues), in a scratch folder that
// stands for /tmp and the current folder, and the output (stdout and stderr
// together) is compared with the block's text, normalised: numbers, hex
// fingerprints and runs of spaces vary, words, flags, columns and line order do
// not. For speed the check runs on a smaller corpus than the README's
// (goldenScale, setupSamples); the normalised output does not depend on its
// size. UPDATE_GOLDEN=1 (make golden) runs the README's commands at full size
// and rewrites the blocks that differ, keeping the README's line wherever it
// normalises to the new one.

// goldenBlocks are the marked blocks, in README order; a README without one
// fails (a deleted marker would silently stop the check).
var goldenBlocks = []string{"synth", "report", "report-pack", "wds-gz", "coco", "parquet", "shard", "shard-nats", "inspect"}

// goldenScale rewrites the README's commands for a fast run.
var goldenScale = strings.NewReplacer("--samples 2000", "--samples 320")

// setupSamples is the size of the corpora goldenSetup makes: the README's 300
// photos, fewer for the check.
func setupSamples() string {
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		return "300"
	}
	return "100"
}

// goldenSetup makes what a block's commands read that the README takes as given.
var goldenSetup = map[string]func(t *testing.T, work string){
	"wds-gz":     wdsShard,
	"coco":       cocoFolder,
	"parquet":    parquetExport,
	"shard-nats": natsWorkers,
}

// goldenRewrite maps what a README command names to what the check runs
// instead (a server's real address); outputs are mapped back. Setups fill it.
var goldenRewrite = map[string]string{}

// TestMain lets the test binary stand in for bin/mmfeed in the README's shell
// commands: run under the name mmfeed, it is the command.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "mmfeed" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

type goldenBlock struct {
	name       string
	start, end int // the block's lines in the README, fences excluded
	cmds       []goldenCmd
}

type goldenCmd struct {
	shell string
	lines []string // the command's own lines, as written
	out   []string
}

func TestReadmeGolden(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 missing (the COCO snippet)")
	}
	readme := filepath.Join("..", "..", "README.md")
	text, err := os.ReadFile(readme)
	must(t, err)
	lines := strings.Split(string(text), "\n")
	blocks := parseGolden(t, lines)
	var names []string
	for _, b := range blocks {
		names = append(names, b.name)
	}
	if strings.Join(names, " ") != strings.Join(goldenBlocks, " ") {
		t.Fatalf("golden blocks in the README: %v, want %v", names, goldenBlocks)
	}
	work := t.TempDir()
	bin := t.TempDir()
	self, err := os.Executable()
	must(t, err)
	must(t, os.Symlink(self, filepath.Join(bin, "mmfeed")))
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "MMFEED_FEATURE_CACHE=off")
	if os.Getenv("MMFEED_TOKENIZER_DIR") == "" && os.Getenv("MMFEED_TOKENIZER") == "" { // the build's, as bin/mmfeed finds it
		dir, err := filepath.Abs(filepath.Join("..", "..", "build", "tokenizers"))
		must(t, err)
		env = append(env, "MMFEED_TOKENIZER_DIR="+dir)
	}
	update := os.Getenv("UPDATE_GOLDEN") == "1"
	changed := false
	rewritten := map[int][]string{}
	for _, b := range blocks {
		if setup := goldenSetup[b.name]; setup != nil {
			setup(t, work)
		}
		var got []string
		for _, c := range b.cmds {
			shell := strings.ReplaceAll(c.shell, "/tmp/", work+"/")
			for readme, real := range goldenRewrite {
				shell = strings.ReplaceAll(shell, readme, real)
			}
			if !update {
				shell = goldenScale.Replace(shell)
			}
			cmd := exec.Command("sh", "-c", shell)
			cmd.Dir, cmd.Env = work, env
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %s: %v\n%s", b.name, shell, err, out.String())
			}
			text := strings.ReplaceAll(out.String(), work+"/", "/tmp/")
			for readme, real := range goldenRewrite {
				text = strings.ReplaceAll(text, real, readme)
			}
			outLines := strings.Split(strings.TrimRight(text, "\n"), "\n")
			if out.Len() == 0 {
				outLines = nil
			}
			if !sameLines(c.out, outLines) {
				t.Errorf("README block %q, command %q: output differs (normalised)\nREADME:\n%s\ngot:\n%s",
					b.name, c.lines[0], strings.Join(c.out, "\n"), strings.Join(outLines, "\n"))
				changed = true
			}
			got = append(got, c.lines...)
			got = append(got, merged(c.out, outLines)...)
		}
		rewritten[b.start] = got
	}
	if update && changed {
		var out []string
		for i := 0; i < len(lines); i++ {
			out = append(out, lines[i])
			for _, b := range blocks {
				if b.start == i+1 {
					out = append(out, rewritten[b.start]...)
					i = b.end - 1
				}
			}
		}
		must(t, os.WriteFile(readme, []byte(strings.Join(out, "\n")), 0o644))
		t.Log("README.md updated: check the diff")
	}
}

var (
	goldenMarker = regexp.MustCompile(`^<!-- golden: ([a-z-]+) -->$`)
	hexRun       = regexp.MustCompile(`\b[0-9a-f]{8,}\b`)
	numberRun    = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)
)

// parseGolden finds the marked blocks and splits each into commands and their
// expected output.
func parseGolden(t *testing.T, lines []string) []goldenBlock {
	var blocks []goldenBlock
	for i := 0; i < len(lines); i++ {
		m := goldenMarker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("README line %d: golden marker %q not followed by a fenced block", i+1, m[1])
		}
		b := goldenBlock{name: m[1], start: i + 2}
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			line := lines[j]
			if !strings.HasPrefix(line, "$ ") {
				if len(b.cmds) == 0 {
					t.Fatalf("README block %q: output before a command: %q", b.name, line)
				}
				c := &b.cmds[len(b.cmds)-1]
				c.out = append(c.out, line)
				continue
			}
			c := goldenCmd{lines: []string{line}}
			shell := strings.TrimPrefix(line, "$ ")
			for (strings.HasSuffix(shell, "\\") || strings.Count(shell, "'")%2 == 1) && j+1 < len(lines) {
				j++
				c.lines = append(c.lines, lines[j])
				if strings.HasSuffix(shell, "\\") {
					shell = strings.TrimSuffix(shell, "\\") + " " + strings.TrimSpace(lines[j])
				} else {
					shell += "\n" + lines[j]
				}
			}
			c.shell = shell
			b.cmds = append(b.cmds, c)
		}
		b.end = j
		blocks = append(blocks, b)
		i = j
	}
	return blocks
}

// normalise keeps what an example must not drift on: words, flags, columns.
func normalise(line string) string {
	line = hexRun.ReplaceAllString(line, "#")
	line = numberRun.ReplaceAllString(line, "#")
	return strings.Join(strings.Fields(line), " ")
}

func sameLines(want, got []string) bool {
	if len(want) != len(got) {
		return false
	}
	for i := range want {
		if normalise(want[i]) != normalise(got[i]) {
			return false
		}
	}
	return true
}

// merged is got, with the README's own line wherever one normalises the same
// (matched in order), so that an update changes only the lines that drifted.
func merged(readme, got []string) []string {
	out := append([]string(nil), got...)
	next := 0
	for i := range got {
		for k := next; k < len(readme); k++ {
			if normalise(readme[k]) == normalise(got[i]) {
				out[i], next = readme[k], k+1
				break
			}
		}
	}
	return out
}

// cocoFolder lays a small synth corpus out as COCO does: train2017/ and
// annotations/captions_train2017.json.
func cocoFolder(t *testing.T, work string) {
	corpus := filepath.Join(t.TempDir(), "corpus")
	mmfeed(t, "synth", "--out", corpus, "--samples", setupSamples(), "--seed", "5")
	must(t, os.MkdirAll(filepath.Join(work, "train2017"), 0o755))
	must(t, os.MkdirAll(filepath.Join(work, "annotations"), 0o755))
	type image struct {
		ID       int    `json:"id"`
		FileName string `json:"file_name"`
	}
	type annotation struct {
		ID      int    `json:"id"`
		ImageID int    `json:"image_id"`
		Caption string `json:"caption"`
	}
	var doc struct {
		Images      []image      `json:"images"`
		Annotations []annotation `json:"annotations"`
	}
	for i, s := range synthSamples(t, corpus) {
		name := filepath.Base(s.Image)
		data, err := os.ReadFile(filepath.Join(corpus, s.Image))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(work, "train2017", name), data, 0o644))
		doc.Images = append(doc.Images, image{ID: i + 1, FileName: name})
		doc.Annotations = append(doc.Annotations, annotation{ID: 1000 + i, ImageID: i + 1, Caption: s.Text})
	}
	data, err := json.Marshal(doc)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(work, "annotations", "captions_train2017.json"), data, 0o644))
}

type synthSample struct {
	Image, Text, ID string
}

func synthSamples(t *testing.T, corpus string) []synthSample {
	f, err := os.Open(filepath.Join(corpus, "manifest.jsonl"))
	must(t, err)
	defer f.Close()
	var out []synthSample
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s struct {
			Image string `json:"image"`
			Text  string `json:"text"`
			ID    string `json:"id"`
		}
		must(t, json.Unmarshal(sc.Bytes(), &s))
		out = append(out, synthSample{s.Image, s.Text, s.ID})
	}
	must(t, sc.Err())
	return out
}

// parquetExport writes export.parquet as HuggingFace datasets does: the image a
// struct {bytes, path}, beside caption and url.
func parquetExport(t *testing.T, work string) {
	corpus := filepath.Join(t.TempDir(), "corpus")
	mmfeed(t, "synth", "--out", corpus, "--samples", setupSamples(), "--seed", "6")
	img := arrow.StructOf(arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
		arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true})
	sc := arrow.NewSchema([]arrow.Field{{Name: "image", Type: img, Nullable: true},
		{Name: "caption", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "url", Type: arrow.BinaryTypes.String, Nullable: true}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for _, s := range synthSamples(t, corpus) {
		data, err := os.ReadFile(filepath.Join(corpus, s.Image))
		must(t, err)
		sb := b.Field(0).(*array.StructBuilder)
		sb.Append(true)
		sb.FieldBuilder(0).(*array.BinaryBuilder).Append(data)
		sb.FieldBuilder(1).(*array.StringBuilder).Append(filepath.Base(s.Image))
		b.Field(1).(*array.StringBuilder).Append(s.Text)
		b.Field(2).(*array.StringBuilder).Append("https://example.com/" + s.ID)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(filepath.Join(work, "export.parquet"))
	must(t, err)
	defer f.Close()
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(), pqarrow.DefaultWriterProps())
	must(t, err)
	must(t, w.Write(rec))
	must(t, w.Close())
}

// TestReadmeReportJSONKeys: every key the README says `report --json` prints
// is in its output (`strategies.<name>.{a, b}`: in each strategy), and one it
// marks "only with `--pack`" is there with --pack and absent without.
func TestReadmeReportJSONKeys(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	must(t, err)
	para := regexp.MustCompile("(?s)`--json` prints one object instead: (.*?)\\.\n").FindSubmatch(text)
	if para == nil {
		t.Fatal("README: no paragraph \"`--json` prints one object instead: ...\"")
	}
	body := strings.Join(strings.Fields(string(para[1])), " ")
	var top, nested, packOnly []string
	for _, m := range regexp.MustCompile("`([^`]+)`( \\(only with `--pack`)?").FindAllStringSubmatch(body, -1) {
		switch name := m[1]; {
		case strings.HasPrefix(name, "strategies.<name>.{"):
			for _, k := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(name, "strategies.<name>.{"), "}"), ",") {
				nested = append(nested, strings.TrimSpace(k))
			}
		case name == "--pack":
		case m[2] != "":
			packOnly = append(packOnly, name)
		default:
			top = append(top, name)
		}
	}
	if len(top) < 4 || len(nested) < 4 {
		t.Fatalf("README lists top-level keys %v and strategy keys %v: parsed wrongly", top, nested)
	}
	corpus := filepath.Join(t.TempDir(), "corpus")
	mmfeed(t, "synth", "--out", corpus, "--samples", "40", "--seed", "2")
	for _, pack := range []bool{false, true} {
		args := []string{"report", "--input", filepath.Join(corpus, "manifest.jsonl"), "--dp", "2",
			"--global-batch", "8", "--feature-cache", "off", "--json"}
		if pack {
			args = append(args, "--pack")
		}
		var got map[string]any
		must(t, json.Unmarshal([]byte(mmfeed(t, args...)), &got))
		for _, k := range top {
			if _, ok := got[k]; !ok {
				t.Errorf("pack=%v: README names %q, the output has no such key", pack, k)
			}
		}
		for _, k := range packOnly {
			if _, ok := got[k]; ok != pack {
				t.Errorf("pack=%v: key %q present %v, README says only with --pack", pack, k, ok)
			}
		}
		strategies, _ := got["strategies"].(map[string]any)
		for name, s := range strategies {
			for _, k := range nested {
				if _, ok := s.(map[string]any)[k]; !ok {
					t.Errorf("README names strategies.<name>.%s, strategy %s has no such key", k, name)
				}
			}
		}
		if len(strategies) == 0 {
			t.Errorf("pack=%v: no strategies in the output", pack)
		}
	}
}

// TestDocsDescribeTheShardLayout: a rank file stores each sample as a one-row
// record batch, as README.md and docs/shard.md say (they said one record batch
// per micro-batch, the layout before).
func TestDocsDescribeTheShardLayout(t *testing.T) {
	dir := t.TempDir()
	mmfeed(t, "synth", "--out", filepath.Join(dir, "corpus"), "--samples", "20", "--seed", "3")
	out := filepath.Join(dir, "shards")
	mmfeed(t, "shard", "--input", filepath.Join(dir, "corpus", "manifest.jsonl"), "--dp", "2", "--global-batch", "8",
		"--image-size", "32", "--feature-cache", "off", "--out", out)
	f, err := os.Open(filepath.Join(out, "rank-00000.arrow"))
	must(t, err)
	defer f.Close()
	r, err := ipc.NewFileReader(f)
	must(t, err)
	defer r.Close()
	for i := 0; i < r.NumRecords(); i++ {
		rec, err := r.RecordBatch(i)
		must(t, err)
		if rec.NumRows() != 1 {
			t.Fatalf("record %d has %d rows, the docs say one", i, rec.NumRows())
		}
	}
	for _, doc := range []string{"README.md", filepath.Join("docs", "shard.md")} {
		text, err := os.ReadFile(filepath.Join("..", "..", doc))
		must(t, err)
		flat := strings.Join(strings.Fields(string(text)), " ")
		if strings.Contains(flat, "one record batch per micro-batch") || !strings.Contains(flat, "each sample a one-row record batch") {
			t.Errorf("%s: the rank files' layout is not \"each sample a one-row record batch\"", doc)
		}
	}
}

// wdsShard writes the WebDataset shard the gzip example compresses:
// wds/shard-000000.tar, at the README's size (a smaller one could fall
// under the truncation warning's 1%).
func wdsShard(t *testing.T, work string) {
	mmfeed(t, "synth", "--out", filepath.Join(work, "wds"), "--format", "wds", "--samples", "300", "--seed", "7")
}

// readmeNATS is the NATS URL the README's `shard --nats` example names.
const readmeNATS = "nats://127.0.0.1:4299"

// natsWorkers starts what the `shard --nats` example takes as running: a
// JetStream server (on a free port, which goldenRewrite puts in place of
// readmeNATS) and two workers on it, stopped when the test ends.
func natsWorkers(t *testing.T, _ string) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	must(t, err)
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			errc <- work.RunWorker(ctx, work.WorkerConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Slots: 1, CacheDir: t.TempDir(),
				Logger: slog.New(slog.DiscardHandler)})
		}()
	}
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-errc; err != nil {
				t.Errorf("worker: %v", err)
			}
		}
		ns.Shutdown()
		delete(goldenRewrite, readmeNATS)
	})
	goldenRewrite[readmeNATS] = ns.ClientURL()
}
