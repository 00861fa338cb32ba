// Responses API, streamed: the text of every output_text delta and the response's headers.
import { report, run, setup } from './common.mjs';

await run(async () => {
  const { client, model } = setup();
  const { data: stream, response } = await client.responses
    .create({ model, input: 'say something', stream: true, max_output_tokens: 8 })
    .withResponse();
  let text = '';
  for await (const event of stream) {
    if (event.type === 'response.output_text.delta') text += event.delta;
  }
  report('responses', true, text, response);
});
