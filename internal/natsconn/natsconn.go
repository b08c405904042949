// Package natsconn connects agents and collectors to NATS with the options
// both share (credentials, TLS, endless reconnects), and runs the embedded
// server that is the default transport.
package natsconn

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
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

// Embedded is the real nats-server, in process.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts nats-server on host:port (port -1 picks a free one)
// and waits until it accepts connections. With storeDir set, JetStream is
// enabled and stores there.
func StartEmbedded(host string, port int, storeDir string) (*Embedded, error) {
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
	if storeDir != "" {
		opts.JetStream = true
		opts.StoreDir = storeDir
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsconn: embedded server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("natsconn: embedded server on %s:%d did not start", host, port)
	}
	return &Embedded{srv: s}, nil
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
