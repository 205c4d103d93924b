package natsenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLS file names that WriteTLS writes into its directory.
const (
	TLSCAFile         = "ca.pem"
	TLSServerCertFile = "server-cert.pem"
	TLSServerKeyFile  = "server-key.pem"
	TLSClientCertFile = "client-cert.pem"
	TLSClientKeyFile  = "client-key.pem"
)

// WriteTLS writes a private certificate authority for one job into dir: the
// CA certificate, a server certificate for hosts (plus localhost and the
// loopback addresses) and one client certificate, ECDSA P-256, valid for
// the given duration, keys readable by the owner only. The CA's key is not
// kept: issuing more certificates means writing a new set.
func WriteTLS(dir string, hosts []string, valid time.Duration) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serve: tls: %w", err)
	}
	now := time.Now().Add(-time.Minute)
	ca := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "mmfeed CA"},
		NotBefore: now, NotAfter: now.Add(valid), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("serve: tls: ca: %w", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return fmt.Errorf("serve: tls: ca: %w", err)
	}
	if err := writePEM(filepath.Join(dir, TLSCAFile), "CERTIFICATE", caDER, 0o644); err != nil {
		return err
	}
	srv := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "mmfeed server"},
		NotBefore: now, NotAfter: now.Add(valid), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			srv.IPAddresses = append(srv.IPAddresses, ip)
		} else if h != "" {
			srv.DNSNames = append(srv.DNSNames, h)
		}
	}
	if err := issue(dir, TLSServerCertFile, TLSServerKeyFile, srv, ca, caKey); err != nil {
		return err
	}
	cli := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "mmfeed client"},
		NotBefore: now, NotAfter: now.Add(valid), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	return issue(dir, TLSClientCertFile, TLSClientKeyFile, cli, ca, caKey)
}

func issue(dir, certFile, keyFile string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serve: tls: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("serve: tls: %s: %w", certFile, err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("serve: tls: %s: %w", keyFile, err)
	}
	if err := writePEM(filepath.Join(dir, certFile), "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, keyFile), "PRIVATE KEY", kb, 0o600)
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode); err != nil {
		return fmt.Errorf("serve: tls: %w", err)
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
