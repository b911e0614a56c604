package idem

import "github.com/idemkit/idem/wire"

// HeaderKey carries an outgoing event's ordering key (Outgoing.Key) to the broker: the sinks of
// partitioned or grouped brokers (Kafka's record key, Pub/Sub's ordering key, an SQS FIFO
// message group) read it, so events of one key stay in order past the relay too.
const HeaderKey = wire.Key
