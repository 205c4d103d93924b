package proto

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/internal/testpeer"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

type peerResult struct {
	File      string    `json:"file"`
	DType     string    `json:"dtype"`
	Rows      int       `json:"rows"`
	Shape     []int     `json:"shape"`
	Job       string    `json:"job"`
	Steps     []int     `json:"steps"`
	InputIDs0 []int32   `json:"input_ids_0"`
	Weights   []float32 `json:"weights"`
}

func TestPyarrowReadsTensors(t *testing.T) {
	py := testpeer.Python(t)
	dir := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	var want []peerResult
	var args []string
	for _, tc := range []struct {
		dtype string
		shape []int
	}{
		{DTypeFloat16, []int{3, 4, 6}}, {DTypeBFloat16, []int{3, 5, 3}}, {DTypeUint8, nil}, {DTypeFloat32, nil},
	} {
		meta := testMeta(ModalityAll, tc.dtype, tc.shape)
		rows := testRows(meta, 5)
		rec, err := BuildRecord(mem, meta, rows)
		if err != nil {
			t.Fatal(err)
		}
		payload, err := EncodeIPC(rec)
		if err != nil {
			t.Fatal(err)
		}
		stream := filepath.Join(dir, tc.dtype+".arrows")
		if err := os.WriteFile(stream, payload, 0o644); err != nil {
			t.Fatal(err)
		}
		// The shard format: an IPC file with two records of one schema.
		file := filepath.Join(dir, tc.dtype+".arrow")
		writeIPCFile(t, file, rec)
		rec.Release()
		args = append(args, stream, file)
		r := peerResult{DType: tc.dtype, Rows: 5, Shape: tc.shape, Job: meta.Job, Steps: []int{meta.Step},
			InputIDs0: rows[0].InputIDs, Weights: []float32{1, 1, 1, 1, 0}}
		r.File = filepath.Base(stream)
		want = append(want, r)
		r.File = filepath.Base(file)
		want = append(want, r, r)
	}
	cmd := exec.Command(py, append([]string{filepath.Join("testdata", "read_ipc.py")}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python peer: %v\n%s", err, stderr.String())
	}
	var got []peerResult
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r peerResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("peer output %q: %v", line, err)
		}
		got = append(got, r)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("peer results:\n got %+v\nwant %+v", got, want)
	}
}

func writeIPCFile(t *testing.T, path string, rec arrow.RecordBatch) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(rec.Schema()))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
