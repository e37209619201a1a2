/* birkhoff.h -- the whole public API of birkhoff, doubly-stochastic
 * (optimal-transport) attention in C. One file per part:
 *
 *   birkhoff/core.h   conventions (layouts, padding, accuracy, threads and
 *                     determinism, workspace and tape), status and errors,
 *                     threads, tensors, vector math, .npy files
 *   birkhoff/context.h  execution contexts: backend, threads, allocator
 *   birkhoff/attn.h   the attention descriptor; softmax, Sinkhorn and unbalanced
 *                     Sinkhorn attention
 *   birkhoff/ops.h    the operator registry: every attention operator by name
 *   birkhoff/esp.h    ESP attention (ESPFormer)
 *   birkhoff/lot.h    LOT attention (LOTFormer)
 *   birkhoff/diff.h   differential attention (DiffTransformer)
 *   birkhoff/linear.h kernelised attention: Linear Transformer, Performer
 *   birkhoff/nystrom.h  Nystrom attention (Nystromformer)
 *   birkhoff/otk.h    the OTK embedding and its unsupervised fits
 *   birkhoff/asap.h   ASAP: Sinkhorn compiled into a loop-free operator
 *   birkhoff/nn.h     the training engine: models, optimisers, checkpoints
 *   birkhoff/data.h   datasets: verified readers, generated sets, batches
 *   birkhoff/train.h  training runs: configuration, loop, evaluation, ASAP compile
 *   birkhoff/metrics.h  translation metrics: corpus BLEU
 *   birkhoff/compat.h the option structs' names before 1.0's convention
 *                     (deprecated aliases)
 */
#ifndef BIRKHOFF_H
#define BIRKHOFF_H

#include "birkhoff/core.h"
#include "birkhoff/context.h"
#include "birkhoff/attn.h"
#include "birkhoff/ops.h"
#include "birkhoff/esp.h"
#include "birkhoff/lot.h"
#include "birkhoff/diff.h"
#include "birkhoff/linear.h"
#include "birkhoff/nystrom.h"
#include "birkhoff/otk.h"
#include "birkhoff/asap.h"
#include "birkhoff/nn.h"
#include "birkhoff/data.h"
#include "birkhoff/train.h"
#include "birkhoff/metrics.h"
#include "birkhoff/compat.h"

#endif /* BIRKHOFF_H */
