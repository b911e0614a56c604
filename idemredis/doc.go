// Package idemredis is the Redis Streams transport for idem: a [Source] that reads a stream
// through a consumer group and a [Sink] that adds entries with XADD, deduplicated within a
// window and confirmed one by one.
package idemredis
