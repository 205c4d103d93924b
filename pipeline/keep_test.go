package pipeline

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// Img2DatasetJSON rewrites the WebDataset shards of dir as img2dataset writes them:
// every sample gets a .json member with "url", "key", "status" and, for keys not a
// multiple of 5, an integer "label" (a sample that had a JSON caption keeps its fields
// there). It returns the kept values each sample should carry, by key.
func img2datasetJSON(t testing.TB, dir string) map[string]map[string]any {
	t.Helper()
	shards, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
	if len(shards) == 0 {
		t.Fatalf("no shards in %s", dir)
	}
	want := map[string]map[string]any{}
	for _, p := range shards {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		tw := tar.NewWriter(&out)
		tr := tar.NewReader(bytes.NewReader(b))
		var group []tarMember
		flush := func() {
			if len(group) > 0 {
				writeGroup(t, tw, addJSON(group, want))
			}
			group = nil
		}
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if len(group) > 0 && memberKey(group[0].name) != memberKey(hdr.Name) {
				flush()
			}
			group = append(group, tarMember{hdr.Name, data})
		}
		flush()
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

type tarMember struct {
	name string
	data []byte
}

func memberKey(name string) string { k, _, _ := strings.Cut(name, "."); return k }

// addJSON adds url, key, status and label to the group's .json member (or a new one).
func addJSON(group []tarMember, want map[string]map[string]any) []tarMember {
	key := memberKey(group[0].name)
	obj := map[string]any{}
	at := -1
	for i, m := range group {
		if strings.HasSuffix(m.name, ".json") {
			if json.Unmarshal(m.data, &obj) != nil {
				return group // a broken caption member stays broken (quarantined)
			}
			at = i
		}
	}
	obj["url"], obj["key"], obj["status"] = "https://example.com/img/"+key+".jpg", key, "success"
	w := map[string]any{"url": obj["url"], "label": nil}
	if n, err := strconv.Atoi(key); err == nil && n%5 != 0 {
		obj["label"], w["label"] = n%7, int64(n%7)
	}
	want[key] = w
	b, _ := json.Marshal(obj)
	if at < 0 {
		return append(group, tarMember{key + ".json", b})
	}
	group[at].data = b
	return group
}

func writeGroup(t testing.TB, tw *tar.Writer, group []tarMember) {
	for _, m := range group {
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(m.data); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShardKeepsColumns: `shard --keep url,json:label,caption` over img2dataset-style
// shards writes keep.url (utf8), keep.label (int64, null where the .json has none) and
// keep.caption beside the tensors, in every row of every rank file (padding copies
// included), and the report counts the missing labels.
func TestShardKeepsColumns(t *testing.T) {
	dir := corpus(t, 60, "wds")
	want := img2datasetJSON(t, dir)
	cfg := testConfig(dir)
	var err error
	if cfg.Loader.Keep, err = loader.ParseKeep("url,json:label,caption"); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	sum, prep, err := runShard(t, cfg, out, DefaultShardOptions(), 0)
	if err != nil {
		t.Fatal(err)
	}
	wantCols := []proto.KeepColumn{{Name: "url", Type: proto.KeepUTF8}, {Name: "label", Type: proto.KeepInt64}, {Name: "caption", Type: proto.KeepUTF8}}
	text := map[string]string{}
	var missing int64
	for _, e := range prep.Index.All() {
		text[e.ID] = e.Text
		if want[e.ID]["label"] == nil {
			missing++
		}
	}
	rows, labels := 0, 0
	for _, f := range sum.Files {
		readShardRows(t, filepath.Join(out, f), func(meta proto.BatchMeta, r proto.Row) {
			if fmt.Sprint(meta.Keep) != fmt.Sprint(wantCols) {
				t.Fatalf("%s: kept columns %v, want %v", f, meta.Keep, wantCols)
			}
			rows++
			w := want[r.ID]
			if len(r.Keep) != 3 || r.Keep[0] != (proto.KeepValue{Text: w["url"].(string), Valid: true}) ||
				r.Keep[2] != (proto.KeepValue{Text: text[r.ID], Valid: true}) {
				t.Errorf("%s: row %s kept %+v, want url %v and its caption", f, r.ID, r.Keep, w["url"])
				return
			}
			switch l := w["label"]; {
			case l == nil && r.Keep[1].Valid:
				t.Errorf("row %s: label %+v, want null", r.ID, r.Keep[1])
			case l != nil && r.Keep[1] != (proto.KeepValue{Text: strconv.FormatInt(l.(int64), 10), Num: true, Valid: true}):
				t.Errorf("row %s: label %+v, want %d", r.ID, r.Keep[1], l)
			case l != nil:
				labels++
			}
		})
	}
	if rows != sum.Rows || labels == 0 || missing == 0 {
		t.Errorf("read %d rows (summary %d), %d labels; %d entries lack one", rows, sum.Rows, labels, missing)
	}
	rep, err := prep.Report()
	if err != nil {
		t.Fatal(err)
	}
	wantKept := []balancer.KeptColumn{{Name: "url", Type: "utf8"}, {Name: "label", Type: "int64", Missing: missing}, {Name: "caption", Type: "utf8"}}
	if fmt.Sprint(rep.Kept) != fmt.Sprint(wantKept) {
		t.Errorf("report kept %+v, want %+v", rep.Kept, wantKept)
	}
}

// readShardRows calls row for every row of the shard file at path (proto.ReadRows).
func readShardRows(t testing.TB, path string, row func(proto.BatchMeta, proto.Row)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	r, err := ipc.NewFileReader(f, ipc.WithAllocator(mem))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.NumRecords() {
		rec, err := r.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		meta, rows, err := proto.ReadRows(rec)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range rows {
			row(meta, x)
		}
	}
}
