package pipeline

import (
	"context"
	"io"
	"reflect"
	"testing"

	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
)

// TestBatchMeta: the one builder of a job's batch metadata sets the pixel
// fields from the image config for every modality that carries images, and
// none for text alone.
func TestBatchMeta(t *testing.T) {
	prep, err := Prepare(context.Background(), testConfig(corpus(t, 24, "jsonl")), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	vocab, pad := TokenizerMeta(prep.Tokenizer)
	if vocab == 0 {
		t.Fatal("the test tokenizer has no vocabulary")
	}
	imagenetMean, imagenetStd := imgproc.DefaultConfig().MeanStd()
	tests := []struct {
		name       string
		policy     string
		dtype      string
		mod        proto.Modality
		pack       bool
		wantDType  string
		wantShape  []int
		wantResize string
	}{
		{"all, fixed square", imgproc.PolicyShorterCrop, imgproc.DTypeFloat16, proto.ModalityAll, false, imgproc.DTypeFloat16, []int{3, 32, 32}, ""},
		{"vision, uint8, packed", imgproc.PolicySquare, imgproc.DTypeUint8, proto.ModalityVision, true, imgproc.DTypeUint8, []int{3, 32, 32}, ""},
		{"text alone has no pixels", imgproc.PolicyShorterCrop, imgproc.DTypeFloat16, proto.ModalityText, false, "", nil, ""},
		{"dynamic resolution has no fixed shape", imgproc.PolicyDynamic, imgproc.DTypeFloat16, proto.ModalityAll, true, imgproc.DTypeFloat16, nil, ""},
		{"jpeg-source names its resize", imgproc.PolicyShorterCrop, imgproc.DTypeJPEGSource, proto.ModalityVision, false,
			imgproc.DTypeJPEGSource, []int{3, 32, 32}, imgproc.PolicyShorterCrop + "/" + imgproc.FilterBilinear},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := *prep
			p.Config.Image.Policy, p.Config.Image.DType = tc.policy, tc.dtype
			got := p.BatchMeta("job", 3, tc.mod, tc.pack)
			want := proto.BatchMeta{Job: "job", Epoch: 3, Modality: tc.mod, DType: tc.wantDType, Shape: tc.wantShape,
				Mean: imagenetMean, Std: imagenetStd, Pack: tc.pack, VocabSize: vocab, PadID: pad,
				Keep: KeepColumns(prep.Index), Resize: tc.wantResize}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if tc.mod != proto.ModalityText {
				if _, err := proto.Schema(got); err != nil {
					t.Errorf("the metadata has no schema: %v", err)
				}
			}
		})
	}
}
