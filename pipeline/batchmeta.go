package pipeline

import (
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/proto"
)

// BatchMeta returns the metadata that every batch of p's job carries for
// modality mod, the one builder of it for shards, served batches and work
// items: job and epoch, the tokenizer's vocabulary and pad id, the kept
// columns, packing (pack: the plan's), the normalization and, unless mod is
// text alone, the pixel encoding (PixelEncoding) and the fixed C,H,W shape
// (none under imgproc.PolicyDynamic). The caller sets the step, the ranks and
// the micro-batch.
func (p *Prepared) BatchMeta(job string, epoch int, mod proto.Modality, pack bool) proto.BatchMeta {
	img := p.Config.Image
	mean, std := img.MeanStd()
	m := proto.BatchMeta{Job: job, Epoch: epoch, Modality: mod, Mean: mean, Std: std, Pack: pack}
	m.VocabSize, m.PadID = TokenizerMeta(p.Tokenizer)
	m.Keep = KeepColumns(p.Index)
	if mod == proto.ModalityText {
		return m
	}
	m.DType, m.Resize = PixelEncoding(img)
	if img.Policy != imgproc.PolicyDynamic {
		m.Shape = []int{3, img.Size, img.Size}
	}
	return m
}
