package proto

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestRegisterValidateAgainst(t *testing.T) {
	job := Layout{DP: 2, MP: 2, Placement: PlacementModality}
	ok := Register{Job: "clip", DPRank: 1, MPRank: 1, DP: 2, MP: 2, Placement: PlacementModality}
	for _, tc := range []struct {
		name    string
		edit    func(*Register)
		layout  Layout
		wantErr error
		wantMsg string
	}{
		{"ok", nil, job, nil, ""},
		{"other job", func(r *Register) { r.Job = "other" }, job, ErrLayout, `job "other", this service runs "clip"`},
		{"world", func(r *Register) { r.DP = 4 }, job, ErrLayout, "trainer layout dp=4 mp=2 (world 8) does not match job layout dp=2 mp=2 (world 4)"},
		{"placement", func(r *Register) { r.Placement = PlacementColocated }, job, ErrLayout, `trainer placement "colocated" does not match job placement "modality"`},
		{"dp rank", func(r *Register) { r.DPRank = 2 }, job, ErrLayout, "dp_rank 2 out of range [0,2)"},
		{"mp rank", func(r *Register) { r.MPRank = -1 }, job, ErrLayout, "mp_rank -1 out of range [0,2)"},
		{"resume", func(r *Register) { r.ResumeStep = -3 }, job, ErrControl, "resume_step -3"},
		{"bad job name", func(r *Register) { r.Job = "a b" }, job, ErrControl, "job name"},
		{"pp missing", nil, Layout{DP: 2, MP: 2, Placement: PlacementModality, PP: 2}, ErrLayout, "trainer pp=1 does not match the job's pp=2"},
		{"pp ok", func(r *Register) { r.MP, r.MPRank, r.PP, r.Placement = 1, 0, 4, PlacementColocated }, Layout{DP: 2, MP: 1, Placement: PlacementColocated, PP: 4}, nil, ""},
		{"pp 1 is no pp", func(r *Register) { r.MP, r.MPRank, r.PP, r.Placement = 1, 0, 1, PlacementColocated }, Layout{DP: 2, MP: 1, Placement: PlacementColocated}, nil, ""},
		{"pp needs mp 1", func(r *Register) { r.PP = 2 }, Layout{DP: 2, MP: 2, Placement: PlacementModality, PP: 2}, ErrLayout, "pipeline stages need mp = 1"},
		{"modality needs mp 2", func(r *Register) { r.MP, r.MPRank = 3, 0 }, Layout{DP: 2, MP: 3, Placement: PlacementModality}, ErrLayout, "placement modality needs mp=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			if tc.edit != nil {
				tc.edit(&r)
			}
			err := r.ValidateAgainst("clip", tc.layout)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got %v, want %v containing %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

func TestModalityFor(t *testing.T) {
	for _, tc := range []struct {
		placement string
		mp, rank  int
		want      Modality
		ok        bool
	}{
		{PlacementColocated, 1, 0, ModalityAll, true},
		{PlacementColocated, 4, 3, ModalityAll, true},
		{PlacementModality, 2, 0, ModalityVision, true},
		{PlacementModality, 2, 1, ModalityText, true},
		{PlacementModality, 1, 0, "", false},
		{PlacementModality, 2, 2, "", false},
		{"pipeline", 2, 0, "", false},
	} {
		t.Run(tc.placement+"/"+strconv.Itoa(tc.mp)+"/"+strconv.Itoa(tc.rank), func(t *testing.T) {
			got, err := ModalityFor(tc.placement, tc.mp, tc.rank)
			if got != tc.want || (err == nil) != tc.ok {
				t.Errorf("got %q, %v, want %q ok=%v", got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestControlRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  any
		into func() any
	}{
		{"register", &Register{Job: "clip", DPRank: 1, DP: 2, MP: 1, Placement: PlacementColocated, Epoch: 1, ResumeStep: 10}, func() any { return &Register{} }},
		{"reply", &RegisterReply{OK: true, PlanHash: "ab12", Steps: 100, MicroBatches: 2, Modality: ModalityText, Stream: "MMFEED_clip"}, func() any { return &RegisterReply{} }},
		{"packed reply", &RegisterReply{OK: true, PlanHash: "ab12", Steps: 100, MicroBatches: 2, Pack: true}, func() any { return &RegisterReply{} }},
		{"feedback", &Feedback{Job: "clip", Step: 3, ComputeSeconds: 0.25, DataWaitSeconds: 0.01, Samples: 31}, func() any { return &Feedback{} }},
		{"done", &Done{Job: "clip", Epoch: 1, Steps: 100}, func() any { return &Done{} }},
		{"resend", &Resend{Job: "clip", Step: 5, MicroBatch: 1, Reason: "checksum"}, func() any { return &Resend{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeControl(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			got := tc.into()
			if err := DecodeControl(b, got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.msg) {
				t.Errorf("got %+v, want %+v", got, tc.msg)
			}
		})
	}
}

func TestDecodeControlRejects(t *testing.T) {
	for _, tc := range []struct {
		name, json string
	}{
		{"unknown field", `{"job":"clip","dprank":1}`},
		{"wrong type", `{"job":"clip","step":"3"}`},
		{"trailing", `{"job":"clip"} {}`},
		{"negative seconds", `{"job":"clip","compute_seconds":-1}`},
		{"bad job", `{"job":"a.b"}`},
		{"not json", `job=clip`},
		{"too big", `{"job":"` + strings.Repeat("x", MaxControlBytes) + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Feedback
			if err := DecodeControl([]byte(tc.json), &f); !errors.Is(err, ErrControl) {
				t.Errorf("got %v, want ErrControl", err)
			}
		})
	}
}

func FuzzDecodeControl(f *testing.F) {
	f.Add([]byte(`{"job":"clip","epoch":1,"step":3,"dp_rank":0,"mp_rank":1,"compute_seconds":0.5,"data_wait_seconds":0,"samples":12}`))
	f.Add([]byte(`{"job":"clip","dp_rank":1,"mp_rank":0,"dp":2,"mp":2,"placement":"modality","epoch":0,"resume_step":0}`))
	f.Add([]byte(`{"job":"clip","epoch":0,"step":42,"micro_batch":1,"dp_rank":1,"mp_rank":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fb Feedback
		if err := DecodeControl(b, &fb); err == nil {
			if err := fb.Validate(); err != nil {
				t.Fatalf("decoded an invalid feedback %+v: %v", fb, err)
			}
		}
		var r Register
		if err := DecodeControl(b, &r); err == nil {
			_ = r.ValidateAgainst("clip", Layout{DP: 2, MP: 2, Placement: PlacementModality})
		}
		var fr FetchRequest
		if err := DecodeControl(b, &fr); err == nil {
			if err := fr.Key().Validate(); err != nil {
				t.Fatalf("decoded an invalid fetch %+v: %v", fr, err)
			}
		}
	})
}
