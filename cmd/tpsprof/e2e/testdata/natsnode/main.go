// natsnode runs one nats-server of a test cluster as a process of its own
// (the NATS-cluster test kills and restarts it): client and route ports,
// routes to the others, JetStream stored under -store.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	name := flag.String("name", "n1", "server name")
	port := flag.Int("port", 4222, "client port")
	cport := flag.Int("cluster-port", 6222, "route port")
	routes := flag.String("routes", "", "comma-separated nats-route:// URLs of the other servers")
	store := flag.String("store", "", "JetStream store folder")
	flag.Parse()
	opts := &server.Options{ServerName: *name, Host: "127.0.0.1", Port: *port, JetStream: true, StoreDir: *store, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "tpsprof-test", Host: "127.0.0.1", Port: *cport}}
	opts.Routes = server.RoutesFromStr(*routes)
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go s.Start()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
}
