package natsenv

import "errors"

// Sentinel errors, wrapped with context; serve's ErrInvalidConfig and
// ErrInsecure are these values, so errors.Is works across both packages.
var (
	// ErrInvalidConfig: a Config field is out of range or inconsistent.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrInsecure: the embedded server would listen on a non-loopback
	// address without authentication, and insecure is not allowed.
	ErrInsecure = errors.New("listening without authentication")
)
