package bench

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
)

// brokerCase is one broker's side of a pipeline case: a source over a fresh topic, the publish
// into that topic, and the cleanup that removes the topic and closes the clients.
type brokerCase struct {
	src     idem.Source
	publish func(ctx context.Context, msgs []idem.Message) error
	close   func()
}

// brokerPipeline runs the pipeline case name over the broker that open sets up on a fresh topic
// (idembench- and a random suffix, so runs never share one), and removes it afterwards.
func (e *env) brokerPipeline(ctx context.Context, name string, workers, batch int, open func(ctx context.Context, topic string) (brokerCase, error)) (Result, error) {
	bc, err := open(ctx, "idembench-"+randHex(4))
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", name, err)
	}
	defer bc.close()
	return e.pipeline(ctx, name, workers, batch, bc.src, bc.publish)
}
