package tokenize

import "errors"

var (
	// ErrClosed is returned by calls on a Tokenizer after Close.
	ErrClosed = errors.New("tokenize: tokenizer is closed")
	// ErrNoTokenizer means no tokenizer.json was given and the default could not be found.
	ErrNoTokenizer = errors.New("tokenize: no tokenizer.json found (run `make build`, or pass a path)")
	// ErrEncode means the model could not encode a text (e.g. its vocabulary lacks the
	// unknown token a character needs). The sample is quarantined, the run goes on.
	ErrEncode = errors.New("tokenize: model cannot encode text")
	// ErrBadConfig means a Config field is out of range.
	ErrBadConfig = errors.New("tokenize: bad config")
)
