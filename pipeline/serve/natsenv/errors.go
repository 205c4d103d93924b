package natsenv

import "errors"

// Sentinel errors, wrapped with context; serve's ErrInvalidConfig,
// ErrInsecure, ErrLeaseLost, ErrLeaseFenced and ErrStorageFull are these
// values, so errors.Is works across both packages.
var (
	// ErrInvalidConfig: a Config field is out of range or inconsistent.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrInsecure: the embedded server would listen on a non-loopback
	// address without authentication, and insecure is not allowed.
	ErrInsecure = errors.New("listening without authentication")
)

// ErrLeaseLost: the service could not renew its leadership of the job in
// time, or another service holds it now; it stops so that only one serves.
var ErrLeaseLost = errors.New("job lease lost")

// ErrLeaseFenced: a write to the job's state was refused because the
// service has not renewed its lease for 3/4 of the TTL (a NATS outage);
// writes resume once it holds the lease again.
var ErrLeaseFenced = errors.New("job lease not renewed: state writes fenced")

// ErrStorageFull: a write of the job's state failed because the embedded
// server's data directory is full (ENOSPC), or its JetStream turned itself
// off after such a failure.
var ErrStorageFull = errors.New("job state storage full")
