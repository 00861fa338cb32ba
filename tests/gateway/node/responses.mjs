// Responses API, not streamed: the response's output_text and the HTTP response's headers.
import { report, run, setup } from './common.mjs';

await run(async () => {
  const { client, model } = setup();
  const { data: result, response } = await client.responses
    .create({ model, input: 'say something', max_output_tokens: 8 })
    .withResponse();
  report('responses', false, result.output_text, response);
});
