package balancer

import "fmt"

// ModelShape is the architecture the cost model is derived from, in the preset
// schema that the bundled trainer reads too: presets/*.json here are generated
// copies of trainer/mmfeed_trainer/presets/*.json (go generate; a test fails
// when they drift), and --model FILE.json takes a file in the same schema.
type ModelShape struct {
	// Name of the preset, informational.
	Name string `json:"name"`
	// Description, informational.
	Description string `json:"description,omitempty"`
	// VisionHidden is the ViT hidden size.
	VisionHidden int `json:"vision_hidden"`
	// VisionLayers is the number of ViT blocks.
	VisionLayers int `json:"vision_layers"`
	// VisionHeads is the ViT's attention heads (the trainer's; no cost term).
	VisionHeads int `json:"vision_heads,omitempty"`
	// PatchSize is the square patch edge in pixels (P = H·W / PatchSize²).
	PatchSize int `json:"patch_size"`
	// ImageChannels is the number of input channels of the patch embedding.
	ImageChannels int `json:"image_channels"`
	// MaxGrid is the largest patch grid side of the trainer's position table.
	MaxGrid int `json:"max_grid,omitempty"`
	// TextHidden is the text encoder's hidden size.
	TextHidden int `json:"text_hidden"`
	// TextLayers is the number of text encoder blocks.
	TextLayers int `json:"text_layers"`
	// TextHeads is the text encoder's attention heads (no cost term).
	TextHeads int `json:"text_heads,omitempty"`
	// Vocab is the text vocabulary size. The embedding lookup costs no FLOPs,
	// so Vocab does not enter the cost; the trainer sizes its embedding with it.
	Vocab int `json:"vocab_size"`
	// PadTokenID pads the trainer's token tensors.
	PadTokenID int `json:"pad_token_id"`
	// MaxTextLen is the trainer's longest caption (position table).
	MaxTextLen int `json:"max_text_len,omitempty"`
	// FusionHidden is the fusion blocks' hidden size.
	FusionHidden int `json:"fusion_hidden"`
	// FusionLayers is the number of fusion blocks: cross-attention (text
	// queries attend to image patches) followed by an MLP. 0 disables fusion.
	FusionLayers int `json:"fusion_layers"`
	// FusionHeads is the fusion blocks' attention heads (no cost term).
	FusionHeads int `json:"fusion_heads,omitempty"`
	// MLPRatio is the MLP hidden size over the model hidden size (all parts).
	MLPRatio float64 `json:"mlp_ratio"`
	// EmbedDim is the trainer's shared contrastive embedding size.
	EmbedDim int `json:"embed_dim,omitempty"`
}

// TinyShape is the bundled trainer's CPU/CI model (presets/tiny.json): ViT
// 64×2 (patch 16), text 64×2, one fusion block of 64, MLP ratio 4, BERT
// vocabulary.
func TinyShape() ModelShape { return mustPreset("tiny") }

// BaseShape is ViT-B/16 + BERT-base + 6 fusion blocks (ALBEF-like sizes,
// presets/base.json).
func BaseShape() ModelShape { return mustPreset("base") }

// Validate checks the shape's fields.
func (s ModelShape) Validate() error {
	bad := func(field string, v any) error {
		return fmt.Errorf("balancer: model shape %s = %v: %w", field, v, ErrInvalidConfig)
	}
	switch {
	case s.VisionHidden <= 0 || s.VisionLayers < 0:
		return bad("vision hidden/layers", [2]int{s.VisionHidden, s.VisionLayers})
	case s.PatchSize <= 0 || s.ImageChannels <= 0:
		return bad("patch size/channels", [2]int{s.PatchSize, s.ImageChannels})
	case s.TextHidden <= 0 || s.TextLayers < 0:
		return bad("text hidden/layers", [2]int{s.TextHidden, s.TextLayers})
	case s.FusionHidden <= 0 || s.FusionLayers < 0:
		return bad("fusion hidden/layers", [2]int{s.FusionHidden, s.FusionLayers})
	case !(s.MLPRatio > 0) || s.MLPRatio > 64:
		return bad("mlp ratio", s.MLPRatio)
	case s.Vocab < 0 || s.PadTokenID < 0 || (s.Vocab > 0 && s.PadTokenID >= s.Vocab):
		return bad("vocab size/pad token id", [2]int{s.Vocab, s.PadTokenID})
	case s.VisionHeads < 0 || s.TextHeads < 0 || s.FusionHeads < 0 ||
		(s.VisionHeads > 0 && s.VisionHidden%s.VisionHeads != 0) ||
		(s.TextHeads > 0 && s.TextHidden%s.TextHeads != 0) ||
		(s.FusionHeads > 0 && s.FusionHidden%s.FusionHeads != 0):
		return bad("heads (each must divide its hidden size)", [3]int{s.VisionHeads, s.TextHeads, s.FusionHeads})
	}
	return nil
}

// fwdBwd is the training multiplier: backward costs twice the forward.
const fwdBwd = 3

// gflop converts FLOPs to GFLOPs.
const gflop = 1e-9

// fusionPasses is how many (text, image) pairs per sample the trainer's
// fusion runs: the positive pair and the two image-text-matching negatives
// (trainer/mmfeed_trainer/models/model.py, Fusion.forward).
const fusionPasses = 3

// Coefficients derives the cost model's coefficients (GFLOP per feature unit)
// from transformer FLOPs; docs/cost-model.md has the derivation. It counts
// what trainer/mmfeed_trainer/models/model.py's flops_per_sample counts (matmuls
// only), including the [CLS] token the trainer prepends to the patches: the
// vision tower and the fusion's keys and values see P + 1 image tokens
// (testdata/flops_golden.json pins the agreement).
//
// Per block of hidden d and MLP ratio r on n tokens, the forward pass costs
// (8+4r)·d² FLOPs per token for the QKV/output projections and the MLP, plus
// 4·n²·d for the attention scores and the weighted sum. Training multiplies by
// three. A fusion block is such a block on the text tokens plus a
// cross-attention: its queries and output (4·d² per text token), keys and
// values from the vision width (4·d_v·d per image token) and the scores
// (4·L·P·d); the fusion runs fusionPasses times per sample.
func (s ModelShape) Coefficients() Coefficients {
	var c Coefficients
	r := s.MLPRatio
	dv, dt, df := float64(s.VisionHidden), float64(s.TextHidden), float64(s.FusionHidden)
	block := func(d float64) float64 { return (8 + 4*r) * d * d }

	// Per vision token (the trainer counts the patch embedding for the [CLS]
	// token too) and per pair of vision tokens, on P + 1 tokens:
	// perToken·(P+1) + perPair·(P+1)² = (perToken + 2·perPair)·P + perPair·P²
	// + (perToken + perPair).
	patchEmbed := 2 * float64(s.ImageChannels*s.PatchSize*s.PatchSize) * dv
	perToken := fwdBwd * gflop * (patchEmbed + float64(s.VisionLayers)*block(dv))
	perPair := fwdBwd * gflop * float64(s.VisionLayers) * 4 * dv
	c[Vision][FeatP] = perToken + 2*perPair
	c[Vision][FeatP2] = perPair
	c[Vision][FeatOne] = perToken + perPair

	c[Text][FeatL] = fwdBwd * gflop * float64(s.TextLayers) * block(dt)
	c[Text][FeatL2] = fwdBwd * gflop * float64(s.TextLayers) * 4 * dt

	if s.FusionLayers > 0 {
		lf := float64(s.FusionLayers)
		l := lf * (block(df) + 4*df*df) // self-attention + MLP, cross-attention queries and output
		if s.TextHidden != s.FusionHidden {
			l += 2 * dt * df // the input projection text → fusion
		}
		f := fwdBwd * gflop * fusionPasses
		// Keys and values and the cross-attention scores see P + 1 image
		// tokens: the [CLS] token adds a per-sample and a per-text-token term.
		c[Fusion][FeatL] = f * (l + lf*4*df)
		c[Fusion][FeatL2] = f * lf * 4 * df
		c[Fusion][FeatP] = f * lf * 4 * dv * df
		c[Fusion][FeatLP] = f * lf * 4 * df
		c[Fusion][FeatOne] = f * lf * 4 * dv * df
	}
	return c
}
