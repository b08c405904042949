package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/internal/natsconn"
)

func runServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server did not start")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// deliver runs a collector and an agent with the given options against
// the server and reports how many of 8 records (2 steps × 4 ranks of job)
// the collector accepted.
func deliver(t *testing.T, url string, colOpts, agentOpts natsconn.Options, job string) int64 {
	t.Helper()
	colOpts.URL, agentOpts.URL = url, url
	col, err := collector.New(collector.Config{OutDir: t.TempDir(), NATS: colOpts, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	dir, _ := os.MkdirTemp("", "tpsprof-sec")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: agentOpts, FlushInterval: 10 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !a.Stats().NATSConnected && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for s := int64(0); s < 2; s++ {
		for r := int64(0); r < 4; r++ {
			a.SubmitStep(stepRec(job, s, r, 4, 10, 1e9))
		}
	}
	time.Sleep(50 * time.Millisecond)
	a.Flush(2 * time.Second)
	col.Sync(2 * time.Second)
	time.Sleep(50 * time.Millisecond)
	col.Sync(2 * time.Second)
	return col.Stats().Records
}

func TestUserPasswordAndToken(t *testing.T) {
	s := runServer(t, &server.Options{Username: "tps", Password: "s3cret"})
	ok := natsconn.Options{User: "tps", Password: "s3cret"}
	if n := deliver(t, s.ClientURL(), ok, ok, "auth"); n != 8 {
		t.Errorf("with the password: %d records, want 8", n)
	}
	if n := deliver(t, s.ClientURL(), ok, natsconn.Options{User: "tps", Password: "wrong"}, "auth"); n != 0 {
		t.Errorf("wrong password delivered %d records", n)
	}
	ts := runServer(t, &server.Options{Authorization: "tok-123"})
	tok := natsconn.Options{Token: "tok-123"}
	if n := deliver(t, ts.ClientURL(), tok, tok, "tok"); n != 8 {
		t.Errorf("with the token: %d records, want 8", n)
	}
}

func TestNKeyAuth(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	os.WriteFile(seedFile, seed, 0o600)
	s := runServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	o := natsconn.Options{NKeyFile: seedFile}
	if n := deliver(t, s.ClientURL(), o, o, "nkey"); n != 8 {
		t.Errorf("with the NKey: %d records, want 8", n)
	}
}

// The documented permission layout: an agent may publish only its own job's
// subjects; records it sends for another job never reach the collector.
func TestAgentPermissionsPerJob(t *testing.T) {
	s := runServer(t, &server.Options{Users: []*server.User{
		{Username: "collector", Password: "c", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"tpsprof.v1.>", "_INBOX.>"}}}},
		{Username: "agent-jobA", Password: "a", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"tpsprof.v1.jobA.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}}}},
	}})
	col := natsconn.Options{User: "collector", Password: "c"}
	ag := natsconn.Options{User: "agent-jobA", Password: "a"}
	if n := deliver(t, s.ClientURL(), col, ag, "jobA"); n != 8 {
		t.Errorf("own job: %d records, want 8", n)
	}
	if n := deliver(t, s.ClientURL(), col, ag, "jobB"); n != 0 {
		t.Errorf("another job's subjects: %d records got through", n)
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s := runServer(t, &server.Options{TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	o := natsconn.Options{TLSCA: caFile}
	if n := deliver(t, url, o, o, "tls"); n != 8 {
		t.Errorf("over TLS: %d records, want 8", n)
	}
	// Without the CA the server's certificate is not trusted: nothing flows.
	if n := deliver(t, url, o, natsconn.Options{}, "tls"); n != 0 {
		t.Errorf("untrusted certificate: %d records got through", n)
	}
}

func TestSecretsRedacted(t *testing.T) {
	if got := natsconn.Redacted("nats://user:hunter2@10.0.0.1:4222"); strings.Contains(got, "hunter2") || !strings.Contains(got, "10.0.0.1:4222") {
		t.Errorf("redacted URL: %q", got)
	}
	_, err := natsconn.Connect(natsconn.Options{URL: "nats://user:hunter2@127.0.0.1:1", NKeyFile: "/nonexistent"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks the password or is missing: %v", err)
	}
}

// writeTestPKI makes a CA and a server certificate for 127.0.0.1.
func writeTestPKI(t *testing.T, dir string) (ca, cert, key string) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tpsprof test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o644)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return ca, cert, key
}
