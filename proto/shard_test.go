package proto

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func TestShardWriter(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	meta := testMeta(ModalityAll, DTypeBFloat16, []int{3, 4, 4})
	var buf bytes.Buffer
	sw, err := NewShardWriter(&buf, meta)
	if err != nil {
		t.Fatal(err)
	}
	var want [][]Row
	for step := range 3 {
		m := meta
		m.Step = step
		rows := testRows(m, 2+step)
		rec, err := BuildRecord(mem, m, rows)
		if err != nil {
			t.Fatal(err)
		}
		err = sw.Write(rec)
		rec.Release()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, rows)
	}
	// A record of another rank does not belong in this shard.
	other := meta
	other.DPRank++
	rec, err := BuildRecord(mem, other, testRows(other, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Write(rec); !errors.Is(err, ErrSchema) {
		t.Errorf("foreign record: got %v, want ErrSchema", err)
	}
	rec.Release()
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	fr, err := ipc.NewFileReader(bytes.NewReader(buf.Bytes()), ipc.WithAllocator(mem))
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	if got, want := fr.NumRecords(), 3; got != want {
		t.Fatalf("records: got %d, want %d", got, want)
	}
	for i := range 3 {
		rec, err := fr.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		m, rows, err := ReadRows(rec)
		if err != nil {
			t.Fatal(err)
		}
		if m.Step != i || !reflect.DeepEqual(rows, project(ModalityAll, want[i])) {
			t.Errorf("record %d: step %d, rows differ", i, m.Step)
		}
	}
	if got, want := ShardFileName("clip", 1, 2, 0), "clip-e1-dp2-mp0.arrow"; got != want {
		t.Errorf("ShardFileName: got %q, want %q", got, want)
	}
}
