package proto

import (
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sharedDoc is the part of trainer/mmfeed_trainer/schema_keys.json that
// names the wire beyond the schema metadata keys (keys_test.go): columns,
// pixel field metadata, chunk headers, subjects. The Python trainer reads
// the same file (mmfeed_trainer/keys.py), so these tests are the drift check
// between the two languages.
type sharedDoc struct {
	Columns         map[string]string   `json:"columns"`
	ModalityColumns map[string][]string `json:"modality_columns"`
	PixelField      struct {
		DType     string   `json:"dtype"`
		Layout    string   `json:"layout"`
		Shape     string   `json:"shape"`
		Mean      string   `json:"mean"`
		Std       string   `json:"std"`
		LayoutCHW string   `json:"layout_chw"`
		DTypes    []string `json:"dtypes"`
	} `json:"pixel_field"`
	Chunk struct {
		Headers         map[string]string `json:"headers"`
		Required        []string          `json:"required"`
		ChecksumPrefix  string            `json:"checksum_prefix"`
		MsgID           string            `json:"msg_id"`
		MsgIDGeneration string            `json:"msg_id_generation"`
	} `json:"chunk"`
	Subjects map[string]json.RawMessage `json:"subjects"`
}

func readShared(t *testing.T) sharedDoc {
	t.Helper()
	raw, err := os.ReadFile("../trainer/mmfeed_trainer/schema_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc sharedDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// expand fills a shared str.format pattern ("mmfeed.{job}.batch.{dp}.{mp}").
func expand(pattern string, vars map[string]string) string {
	for k, v := range vars {
		pattern = strings.ReplaceAll(pattern, "{"+k+"}", v)
	}
	return pattern
}

// sameMap reports every name whose value differs between the shared file
// (want) and proto (got), and names only one side defines.
func sameMap(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[name]; !ok {
			t.Errorf("%s %s: schema_keys.json says %q, proto has no such name", what, name, want[name])
		} else if g != want[name] {
			t.Errorf("%s %s: schema_keys.json says %q, proto says %q", what, name, want[name], g)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s %s: proto says %q, schema_keys.json does not define it", what, name, got[name])
		}
	}
}

// TestColumnsMatchTrainer fails when the Arrow column names, the columns of
// each modality or the pixel field metadata drift from the shared file that
// mmfeed_trainer/data/batches.py reads.
func TestColumnsMatchTrainer(t *testing.T) {
	doc := readShared(t)
	sameMap(t, "column", doc.Columns, map[string]string{
		"id": ColID, "step": ColStep, "micro_batch": ColMicroBatch, "input_ids": ColInputIDs,
		"pixel_values": ColPixelValues, "pixel_shape": ColPixelShape, "text_tokens": ColTextTokens,
		"image_tokens": ColImageTokens, "cost": ColCost, "weight": ColWeight,
	})
	for _, m := range []Modality{ModalityAll, ModalityVision, ModalityText} {
		if got, want := m.Columns(), doc.ModalityColumns[string(m)]; !slices.Equal(got, want) {
			t.Errorf("modality %s: proto columns %v, schema_keys.json %v", m, got, want)
		}
		meta := testMeta(m, DTypeFloat16, nil)
		s, err := Schema(meta)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fieldNames(s), doc.ModalityColumns[string(m)]; !slices.Equal(got, want) {
			t.Errorf("modality %s: Schema writes columns %v, schema_keys.json %v", m, got, want)
		}
	}
	if len(doc.ModalityColumns) != 3 {
		t.Errorf("schema_keys.json modality_columns has %d modalities, proto 3", len(doc.ModalityColumns))
	}
	pf := doc.PixelField
	sameMap(t, "pixel field key", map[string]string{"dtype": pf.DType, "layout": pf.Layout, "shape": pf.Shape,
		"mean": pf.Mean, "std": pf.Std, "layout_chw": pf.LayoutCHW},
		map[string]string{"dtype": FieldDType, "layout": FieldLayout, "shape": FieldShape, "mean": FieldMean,
			"std": FieldStd, "layout_chw": LayoutCHW})
	for _, dt := range pf.DTypes {
		if DTypeSize(dt) == 0 {
			t.Errorf("schema_keys.json pixel dtype %q is not one proto knows", dt)
		}
	}
	ours := []string{DTypeFloat16, DTypeFloat32, DTypeBFloat16, DTypeUint8, DTypeJPEG, DTypeJPEGSource}
	if !slices.Equal(pf.DTypes, ours) {
		t.Errorf("schema_keys.json pixel dtypes %v, proto %v", pf.DTypes, ours)
	}
	// The pixel field metadata Schema writes uses exactly the shared keys (resize: jpeg_source).
	meta := testMeta(ModalityAll, DTypeUint8, nil)
	s, _ := Schema(meta)
	f, _ := s.FieldsByName(ColPixelValues)
	if got, want := f[0].Metadata.Keys(), []string{pf.DType, pf.Layout, pf.Shape, pf.Mean, pf.Std}; !slices.Equal(got, want) {
		t.Errorf("pixel_values field metadata keys %v, schema_keys.json %v", got, want)
	}
}

// TestChunkHeadersMatchTrainer fails when the chunk header names, which of
// them are required, the checksum prefix or the message id layout drift from
// the shared file that mmfeed_trainer/data/wire.py reads; it checks the headers
// Header writes and ParseChunkHeader requires, not only the constants.
func TestChunkHeadersMatchTrainer(t *testing.T) {
	c := readShared(t).Chunk
	sameMap(t, "chunk header", c.Headers, map[string]string{
		"job": HdrJob, "epoch": HdrEpoch, "step": HdrStep, "micro_batch": HdrMicroBatch, "dp_rank": HdrDPRank,
		"mp_rank": HdrMPRank, "chunk": HdrChunk, "size": HdrSize, "checksum": HdrChecksum, "schema": HdrSchema,
		"generation": HdrGeneration, "msg_id": HdrMsgID,
	})
	if c.ChecksumPrefix != checksumPrefix {
		t.Errorf("schema_keys.json checksum_prefix %q, proto %q", c.ChecksumPrefix, checksumPrefix)
	}
	key := BatchKey{Job: "j-1", Epoch: 3, Step: 14, MicroBatch: 1, DPRank: 5, MPRank: 9}
	for _, gen := range []int{0, 2} {
		h := ChunkHeader{BatchKey: key, Gen: gen, Index: 2, Count: 7, Size: 12345, Checksum: 0xdeadbeef}
		hd := h.Header()
		want := map[string]string{}
		for _, name := range c.Required {
			want[c.Headers[name]] = ""
		}
		want[c.Headers["msg_id"]] = ""
		if gen > 0 {
			want[c.Headers["generation"]] = ""
		}
		got := map[string]string{}
		for k := range hd {
			got[k] = ""
		}
		if !maps.Equal(got, want) {
			t.Errorf("gen %d: Header writes %v, schema_keys.json wants %v", gen, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		if v := hd.Get(c.Headers["checksum"]); v != c.ChecksumPrefix+"deadbeef" {
			t.Errorf("gen %d: checksum header %q, want prefix %q", gen, v, c.ChecksumPrefix)
		}
		if v := hd.Get(c.Headers["schema"]); v != SchemaVersion {
			t.Errorf("gen %d: schema header %q, want %q", gen, v, SchemaVersion)
		}
		id := expand(c.MsgID, map[string]string{"job": key.Job, "epoch": "3", "step": "14", "micro_batch": "1",
			"dp_rank": "5", "mp_rank": "9", "chunk": "2"})
		if gen > 0 {
			id += expand(c.MsgIDGeneration, map[string]string{"generation": strconv.Itoa(gen)})
		}
		if got := key.MsgID(2, gen); got != id {
			t.Errorf("gen %d: MsgID %q, schema_keys.json pattern gives %q", gen, got, id)
		}
		for _, name := range c.Required {
			cut := hd.Get(c.Headers[name])
			hd.Del(c.Headers[name])
			if _, err := ParseChunkHeader(hd); err == nil {
				t.Errorf("gen %d: ParseChunkHeader accepts a chunk without required header %s", gen, c.Headers[name])
			}
			hd.Set(c.Headers[name], cut)
		}
		hd.Del(c.Headers["msg_id"])
		hd.Del(c.Headers["generation"])
		if _, err := ParseChunkHeader(hd); err != nil {
			t.Errorf("gen %d: without the optional headers: %v", gen, err)
		}
	}
}

// TestSubjectsMatchTrainer fails when a subject, inbox, stream, consumer or
// bucket name, or a control kind, drifts from the shared patterns that
// mmfeed_trainer/data/stream fills.
func TestSubjectsMatchTrainer(t *testing.T) {
	doc := readShared(t)
	pattern := map[string]string{}
	var kinds map[string]string
	for name, raw := range doc.Subjects {
		switch name {
		case "_doc":
		case "control_kinds":
			if err := json.Unmarshal(raw, &kinds); err != nil {
				t.Fatal(err)
			}
		default:
			var p string
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("subjects.%s: %v", name, err)
			}
			pattern[name] = p
		}
	}
	sameMap(t, "control kind", kinds, map[string]string{"register": CtlRegister, "feedback": CtlFeedback,
		"done": CtlDone, "resend": CtlResend})
	const job, dp, mp = "job_7", 3, 1
	vars := map[string]string{"job": job, "dp": "3", "mp": "1", "kind": CtlFeedback}
	must := func(s string, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	got := map[string]string{
		"batch":        must(BatchSubject(job, dp, mp)),
		"control":      must(ControlSubject(job, CtlFeedback)),
		"rank_control": must(RankControlSubject(job, CtlFeedback, dp, mp)),
		"fetch":        must(FetchSubject(job, dp, mp)),
		"ack":          must(AckSubject(job, dp, mp)),
		"view":         must(ViewSubject(job, dp, mp)),
		"inbox_prefix": must(InboxPrefix(job, dp, mp)),
		"stream":       StreamName(job),
		"consumer":     ConsumerName(job, dp, mp),
		"bucket":       BucketName(job),
	}
	want := map[string]string{}
	for name, p := range pattern {
		want[name] = expand(p, vars)
		if strings.ContainsAny(want[name], "{}") {
			t.Errorf("subjects.%s %q: unknown placeholder", name, p)
		}
	}
	sameMap(t, "subject", want, got)
	if !strings.HasPrefix(pattern["batch"], SubjectPrefix+".") {
		t.Errorf("subjects.batch %q does not start with %q", pattern["batch"], SubjectPrefix)
	}
}
