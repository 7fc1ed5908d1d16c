/* The full gRPC method names of Ferry's services (dispatcher.proto and
 * worker.proto in proto/ferry/v1) and of the standard health check: the one
 * place they are spelled, for the servers that register them and the clients
 * that call them. */
#ifndef FERRY_RPC_METHODS_H
#define FERRY_RPC_METHODS_H

/* ferry.v1.Dispatcher (dispatcher.proto). */
#define FERRY_METHOD_REGISTER_DATASET "/ferry.v1.Dispatcher/RegisterDataset"
#define FERRY_METHOD_GET_OR_CREATE_JOB "/ferry.v1.Dispatcher/GetOrCreateJob"
#define FERRY_METHOD_CLIENT_HEARTBEAT "/ferry.v1.Dispatcher/ClientHeartbeat"
#define FERRY_METHOD_WORKER_HEARTBEAT "/ferry.v1.Dispatcher/WorkerHeartbeat"
#define FERRY_METHOD_GET_STATUS "/ferry.v1.Dispatcher/GetStatus"
#define FERRY_METHOD_DRAIN_WORKER "/ferry.v1.Dispatcher/DrainWorker"
#define FERRY_METHOD_CANCEL_JOB "/ferry.v1.Dispatcher/CancelJob"

/* ferry.v1.Worker (worker.proto): the chunk stream over gRPC. */
#define FERRY_METHOD_STREAM_CHUNKS "/ferry.v1.Worker/StreamChunks"
/* The UCX transport's control call (common/src/transport/transport_ucx.c): the
 * same request with the client's UCP address; the chunks travel over UCX. */
#define FERRY_METHOD_STREAM_CHUNKS_UCX "/ferry.v1.Worker/StreamChunksUcx"

/* grpc.health.v1.Health (every Ferry server). */
#define FERRY_METHOD_HEALTH_CHECK "/grpc.health.v1.Health/Check"

#endif /* FERRY_RPC_METHODS_H */
