//! The `drun.v1` codec: prost's, with small starting buffers.
//!
//! tonic gives every stream an 8 KiB encode buffer and an 8 KiB decode buffer up front. A
//! `drun.v1` message is a few hundred bytes (a plan of more than 64 nodes reaches each agent
//! with its own entry only), and a `drun-rendezvous` server holds one session stream per agent:
//! at 10,000 agents the two buffers were 16 KiB of every agent's memory on the server. Here they
//! start at [`BUFFER_SIZE`] and grow when a message needs more, as tonic's do.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Bytes each stream's encode and decode buffers start with.
pub const BUFFER_SIZE: usize = 1024;

/// How many encoded bytes a stream gathers before it hands them to the transport (tonic's
/// default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_SIZE`] buffers (named by the generated code).
#[derive(Debug, Clone)]
pub struct SmallBuffers<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBuffers<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

impl<T, U> Codec for SmallBuffers<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
