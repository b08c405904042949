// Package natsconn connects agents and collectors to NATS with the options
// both share (credentials, TLS, endless reconnects), and runs the embedded
// server that is the default transport.
// It owns connecting and the embedded server; it never decides what is
// sent (package wire's subjects and payloads).
package natsconn

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Options say where NATS is and how to authenticate. Secrets are never
// printed: use Redacted for logs.
type Options struct {
	URL       string
	User      string
	Password  string
	Token     string
	CredsFile string // JWT + NKey credentials file
	NKeyFile  string // NKey seed file
	TLSCert   string // client certificate (mutual TLS)
	TLSKey    string
	TLSCA     string // CA that signed the server's certificate
	Name      string // connection name shown by the server
	// ReconnectBufBytes bounds what the client holds while disconnected.
	ReconnectBufBytes int
}

// Redacted returns the URL (or comma-separated list of URLs) with any user
// info replaced, for logs.
func Redacted(raw string) string {
	if strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = Redacted(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		if err != nil {
			return "(unparsable URL)"
		}
		return raw
	}
	u.User = url.User("REDACTED")
	return u.String()
}

// Connect dials NATS. The connection retries forever in the background
// (also when the first attempt fails), so a NATS outage delays delivery but
// never stops the caller.
func Connect(o Options, extra ...nats.Option) (*nats.Conn, error) {
	if o.URL == "" {
		return nil, errors.New("natsconn: no NATS URL")
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(10 * time.Second),
	}
	if o.ReconnectBufBytes != 0 {
		opts = append(opts, nats.ReconnectBufSize(o.ReconnectBufBytes))
	}
	if o.User != "" || o.Password != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsconn: nkey seed file: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsconn: connect to %s: %w", Redacted(o.URL), err)
	}
	return nc, nil
}

// Refused reports whether err says the server refused the client's
// credentials (a wrong token, user or password, or an expired
// credential), which retrying will not fix, as opposed to an outage.
func Refused(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return true
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "authorization violation") || strings.Contains(m, "authentication")
}

// Cause says in words why a connection to NATS failed, for the messages
// that report it: wrong credentials, a host name that does not resolve,
// nothing listening on the port, something that is not NATS answering
// there (an HTTP or TLS port), or no answer at all; "" for nil.
func Cause(err error) string {
	var dns *net.DNSError
	var op *net.OpError
	switch {
	case err == nil:
		return ""
	case Refused(err):
		return "the server refused the credentials (wrong token, user or password)"
	case errors.As(err, &dns):
		return "the host name does not resolve (DNS): " + dns.Name
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nothing listens on that port (connection refused)"
	case errors.Is(err, nats.ErrNoInfoReceived), strings.Contains(err.Error(), "expected INFO"),
		errors.As(err, &op) && op.Op == "read" && op.Timeout():
		return "something answers on that port but not as NATS does (the HTTP or monitoring port, or TLS where plain was expected?)"
	case errors.As(err, &op) && op.Op == "dial" && op.Timeout(), errors.Is(err, nats.ErrTimeout):
		return "no answer (the host is down, or a firewall drops the connection)"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the host"
	}
	return err.Error()
}

// Embedded is the real nats-server, in process.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts nats-server on host:port (port -1 picks a free one)
// with no authentication, and waits until it accepts connections. With
// storeDir set, JetStream is enabled and stores there. Tests and
// in-process uses take it; the collector command uses StartEmbeddedAuth.
func StartEmbedded(host string, port int, storeDir string) (*Embedded, error) {
	return StartEmbeddedAuth(host, port, storeDir, Auth{})
}

// Auth is what the embedded server requires of clients: a user and
// password, or a token; neither means none (any local user could then
// read every record, forge records and delete the stream).
type Auth struct {
	User, Password, Token string
}

// StartEmbeddedAuth is StartEmbedded requiring auth of every client.
func StartEmbeddedAuth(host string, port int, storeDir string, auth Auth) (*Embedded, error) {
	if port > 0 {
		// the server only says "did not start" after its timeout: try the
		// address first for the real reason (address in use, no such host)
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("natsconn: embedded server cannot listen on %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
		}
		ln.Close()
	}
	opts := &server.Options{Host: host, Port: port, NoLog: true, NoSigs: true, MaxPayload: 8 << 20}
	switch {
	case auth.User != "":
		opts.Username, opts.Password = auth.User, auth.Password
	case auth.Token != "":
		opts.Authorization = auth.Token
	}
	if storeDir != "" {
		opts.JetStream = true
		opts.StoreDir = storeDir
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsconn: embedded server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) { // (10 s ran out once on a 2-core CI machine under load)
		s.Shutdown()
		return nil, fmt.Errorf("natsconn: embedded server on %s:%d did not start", host, port)
	}
	return &Embedded{srv: s}, nil
}

// TokenPath is where the collector keeps the embedded server's token and
// agents of the same user look for it: the user's config directory
// (~/.config/tpsprof/nats-token), shared by the nodes of a cluster whose
// home directories are.
func TokenPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("natsconn: no config directory for the NATS token: %w", err)
	}
	return filepath.Join(dir, "tpsprof", "nats-token"), nil
}

// EnsureToken returns the embedded server's token, creating it (32 random
// bytes, hex; the file mode 0600 in a 0700 folder) on first use. A token
// file that others could read is replaced.
func EnsureToken() (token, path string, err error) {
	path, err = TokenPath()
	if err != nil {
		return "", "", err
	}
	if t := readOwnToken(path); t != "" {
		return t, path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", "", fmt.Errorf("natsconn: token folder: %w", err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = hex.EncodeToString(b)
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("natsconn: write token: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", "", fmt.Errorf("natsconn: write token: %w", err)
	}
	return token, path, nil
}

// LocalToken is the token EnsureToken wrote, for agents of the same user:
// "" when there is none, or when the file is not the user's own or others
// may read it (then it is not trusted).
func LocalToken() string {
	path, err := TokenPath()
	if err != nil {
		return ""
	}
	return readOwnToken(path)
}

func readOwnToken(path string) string {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 || !ownedByMe(fi) {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 || len(t) > 256 {
		return ""
	}
	return t
}

// IsLoopback reports whether host (an address or name) is this machine
// only.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// URL is what agents connect to.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Server exposes the server, for tests that restart or inspect it.
func (e *Embedded) Server() *server.Server { return e.srv }

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// AgentURLs are the URLs agents on other machines can give to reach a
// server listening on host:port: for a wildcard address (0.0.0.0, ::, "")
// this machine's name and its non-loopback addresses, else the address
// itself. Local is true when only this machine can connect (loopback).
func AgentURLs(host string, port int) (urls []string, local bool) {
	url := func(h string) string { return "nats://" + net.JoinHostPort(h, strconv.Itoa(port)) }
	ip := net.ParseIP(host)
	switch {
	case host == "localhost" || (ip != nil && ip.IsLoopback()):
		return []string{url(host)}, true
	case host != "" && (ip == nil || !ip.IsUnspecified()):
		return []string{url(host)}, false
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		urls = append(urls, url(name))
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() {
			continue
		}
		if ip != nil && ip.To4() != nil && n.IP.To4() == nil {
			continue // 0.0.0.0 listens on IPv4 only
		}
		urls = append(urls, url(n.IP.String()))
	}
	if len(urls) == 0 {
		urls = []string{url("127.0.0.1")}
		local = true
	}
	return urls, local
}
