package proto

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

func TestBuildRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   Modality
		dtype string
		shape []int
		rows  int
		pack  bool
	}{
		{"all/float16/fixed", ModalityAll, DTypeFloat16, []int{3, 4, 5}, 6, false},
		{"all/float32/dynamic", ModalityAll, DTypeFloat32, nil, 5, false},
		{"all/bfloat16/fixed", ModalityAll, DTypeBFloat16, []int{3, 2, 2}, 3, false},
		{"all/uint8/dynamic", ModalityAll, DTypeUint8, nil, 4, false},
		{"vision/float16/fixed", ModalityVision, DTypeFloat16, []int{3, 4, 4}, 4, false},
		{"text", ModalityText, "", nil, 5, false},
		{"all/empty", ModalityAll, DTypeFloat16, []int{3, 2, 2}, 0, false},
		{"all/packed", ModalityAll, DTypeFloat32, nil, 3, true},
		{"text/packed", ModalityText, "", nil, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			meta := testMeta(tc.mod, tc.dtype, tc.shape)
			meta.Pack = tc.pack
			rows := testRows(meta, tc.rows)
			rec, err := BuildRecord(mem, meta, rows)
			if err != nil {
				t.Fatalf("BuildRecord: %v", err)
			}
			defer rec.Release()
			if got, want := rec.NumRows(), int64(tc.rows); got != want {
				t.Fatalf("rows: got %d, want %d", got, want)
			}
			payload, err := EncodeIPC(rec)
			if err != nil {
				t.Fatalf("EncodeIPC: %v", err)
			}
			back, err := DecodeIPC(mem, payload)
			if err != nil {
				t.Fatalf("DecodeIPC: %v", err)
			}
			defer back.Release()
			gotMeta, gotRows, err := ReadRows(back)
			if err != nil {
				t.Fatalf("ReadRows: %v", err)
			}
			wantMeta := meta
			if tc.rows == 0 {
				wantMeta.Step, wantMeta.MicroBatch = 0, 0
			}
			if !tc.mod.hasVision() {
				wantMeta.DType, wantMeta.Mean, wantMeta.Std = "", [3]float32{}, [3]float32{}
			}
			if !reflect.DeepEqual(gotMeta, wantMeta) {
				t.Errorf("meta: got %+v, want %+v", gotMeta, wantMeta)
			}
			if want := project(tc.mod, rows); !reflect.DeepEqual(gotRows, want) && !(len(gotRows) == 0 && len(want) == 0) {
				t.Errorf("rows differ:\n got %+v\nwant %+v", gotRows, want)
			}
		})
	}
}

func TestSchemaGolden(t *testing.T) {
	for _, mod := range []Modality{ModalityAll, ModalityVision, ModalityText} {
		t.Run(string(mod), func(t *testing.T) {
			s, err := Schema(testMeta(mod, DTypeBFloat16, []int{3, 224, 224}))
			if err != nil {
				t.Fatal(err)
			}
			got := s.String() + "\n"
			path := filepath.Join("testdata", "schema_"+string(mod)+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./proto -run TestSchemaGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("schema differs from %s:\n got %s\nwant %s", path, got, want)
			}
		})
	}
}

func TestBuildRecordRejects(t *testing.T) {
	base := testMeta(ModalityAll, DTypeFloat16, []int{3, 2, 2})
	good := func() []Row { return testRows(base, 2) }
	for _, tc := range []struct {
		name    string
		meta    func(*BatchMeta)
		rows    func([]Row)
		wantErr error
		wantMsg string
	}{
		{"bad job", func(m *BatchMeta) { m.Job = "a.b" }, nil, ErrInvalidName, "job name"},
		{"bad dtype", func(m *BatchMeta) { m.DType = "int8" }, nil, ErrInvalidMeta, "dtype"},
		{"bad modality", func(m *BatchMeta) { m.Modality = "audio" }, nil, ErrInvalidMeta, "modality"},
		{"bad shape", func(m *BatchMeta) { m.Shape = []int{3, 0, 2} }, nil, ErrInvalidMeta, "fixed shape"},
		{"negative step", func(m *BatchMeta) { m.Step = -1 }, nil, ErrInvalidMeta, "step"},
		{"uint8 zero std", func(m *BatchMeta) { m.DType = DTypeUint8; m.Std[1] = 0 }, nil, ErrInvalidMeta, "std[1]"},
		{"short pixels", nil, func(r []Row) { r[1].Pixels = r[1].Pixels[:5] }, ErrInvalidRow, "row 1"},
		{"shape differs", nil, func(r []Row) { r[0].PixelShape = [3]int32{3, 1, 4} }, ErrInvalidRow, "fixed shape"},
		{"nan cost", nil, func(r []Row) { r[0].Cost = -1 }, ErrInvalidRow, "cost"},
		{"negative tokens", nil, func(r []Row) { r[0].TextTokens = -1 }, ErrInvalidRow, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			meta, rows := base, good()
			if tc.meta != nil {
				tc.meta(&meta)
			}
			if tc.rows != nil {
				tc.rows(rows)
			}
			rec, err := BuildRecord(mem, meta, rows)
			if rec != nil {
				rec.Release()
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got %v, want %v containing %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

func TestDecodeIPCRejects(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	meta := testMeta(ModalityAll, DTypeFloat16, []int{3, 2, 2})
	rec, err := BuildRecord(mem, meta, testRows(meta, 3))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeIPC(rec)
	rec.Release()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", payload[:len(payload)/2]},
		{"garbage", []byte("not an arrow stream at all, really not")},
		{"schema only", payload[:schemaEnd(t, payload)]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := DecodeIPC(mem, tc.b)
			if rec != nil {
				rec.Release()
			}
			if !errors.Is(err, ErrSchema) {
				t.Errorf("got %v, want ErrSchema", err)
			}
		})
	}
}

// schemaEnd returns the length of the schema message at the start of an IPC
// stream (continuation marker, int32 length, metadata).
func schemaEnd(t *testing.T, b []byte) int {
	t.Helper()
	if len(b) < 8 {
		t.Fatal("short payload")
	}
	n := int(uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24)
	return 8 + n
}

func TestChecksumIsCRC32C(t *testing.T) {
	// The CRC-32C check value docs/protocol.md quotes for clients.
	if got, want := Checksum([]byte("123456789")), uint32(0xe3069283); got != want {
		t.Errorf("Checksum(123456789) = %08x, want %08x", got, want)
	}
}

func FuzzDecodeIPC(f *testing.F) {
	for _, mod := range []Modality{ModalityAll, ModalityText} {
		meta := testMeta(mod, DTypeFloat16, nil)
		rec, err := BuildRecord(memory.DefaultAllocator, meta, testRows(meta, 3))
		if err != nil {
			f.Fatal(err)
		}
		b, err := EncodeIPC(rec)
		rec.Release()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
		rec, err := DecodeIPC(mem, b)
		if err != nil {
			if got := mem.CurrentAlloc(); got != 0 {
				t.Fatalf("rejected payload leaked %d bytes", got)
			}
			return
		}
		defer rec.Release()
		if _, _, err := ReadRows(rec); err != nil {
			t.Fatalf("DecodeIPC accepted a record ReadRows rejects: %v", err)
		}
	})
}

// A pack flag other than "true" (or absent) is a schema error, not a silent padded plan.
func TestMetaPackRejectsOtherValues(t *testing.T) {
	meta := testMeta(ModalityText, "", nil)
	meta.Pack = true
	s, err := Schema(meta)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := MetaFromSchema(s); err != nil || !got.Pack {
		t.Fatalf("packed schema: got pack=%v, %v", got.Pack, err)
	}
	md := s.Metadata()
	vals := append([]string(nil), md.Values()...)
	vals[md.FindKey(MetaPack)] = "yes"
	badMD := arrow.NewMetadata(md.Keys(), vals)
	bad := arrow.NewSchema(s.Fields(), &badMD)
	if _, err := MetaFromSchema(bad); !errors.Is(err, ErrSchema) {
		t.Fatalf("pack=yes: got %v, want ErrSchema", err)
	}
}
